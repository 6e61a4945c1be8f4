"""fsspec's own abstract test suite (copy, get, put, open, pipe) against `silt://` over a real
S3 server, through an embedded client."""

import posixpath
import uuid

import fsspec.tests.abstract as abstract
import pytest

import silt


@pytest.fixture(scope="module")
def module_fs(s3_server, tmp_path_factory):
    cache = tmp_path_factory.mktemp("abstract-cache")
    fs = silt.SiltFileSystem(
        mounts={"/s3": f"s3://{s3_server.bucket}"},
        cache_dir=str(cache),
        skip_instance_cache=True,
        **s3_server.options(),
    )
    assert fs.client.mode == "single"
    yield fs
    fs.close()


class SiltFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, module_fs):
        return module_fs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self):
        return f"/s3/abstract-{uuid.uuid4().hex[:8]}"


class TestSiltCopy(abstract.AbstractCopyTests, SiltFixtures):
    pass


class TestSiltGet(abstract.AbstractGetTests, SiltFixtures):
    pass


class TestSiltPut(abstract.AbstractPutTests, SiltFixtures):
    pass


class TestSiltOpen(abstract.AbstractOpenTests, SiltFixtures):
    pass


class TestSiltPipe(abstract.AbstractPipeTests, SiltFixtures):
    pass
