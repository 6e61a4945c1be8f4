//! A small network of "hosts" for multi-host tests: a Linux bridge in the test's own network
//! namespace with one network namespace per host hanging off it by a veth pair.
//!
//! ```text
//!   test process (root ns) ── bridge slN 10.213.N.1/24
//!                               ├── veth ── netns slN-h0  10.213.N.10
//!                               ├── veth ── netns slN-h1  10.213.N.11
//!                               └── ...
//! ```
//!
//! Servers the hosts need (etcd, S3) listen on the bridge address; processes started with
//! [`NetLab::command`] run inside one host's namespace. [`NetLab::cut`] takes a host's link
//! down (packets are dropped, connections hang: a partition, not a refusal). Dropping the lab
//! kills every process left in its namespaces and deletes namespaces, links and the bridge,
//! also when the test panics. Needs root (tests that use it are skipped without).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};

/// Lab numbers handed out in this process; across processes the bridge name decides.
static NEXT: AtomicU8 = AtomicU8::new(0);

pub struct NetLab {
    n: u8,
    hosts: usize,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetLab {
    /// Whether this process may build labs (root, `ip` present).
    pub fn available() -> bool {
        crate::is_root() && Command::new("ip").arg("-V").output().is_ok()
    }

    /// A bridge and `hosts` namespaces attached to it.
    pub fn new(hosts: usize) -> Result<NetLab, String> {
        assert!(hosts > 0 && hosts < 200);
        // Pick a free lab number: creating the bridge is the atomic claim.
        let start = (std::process::id() as u8).wrapping_mul(31);
        for _ in 0..250 {
            let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % 250 + 1;
            if ip(&["link", "add", &format!("sl{n}"), "type", "bridge"]).is_err() {
                continue;
            }
            let lab = NetLab { n, hosts: 0 };
            return lab.build(hosts);
        }
        Err("no free lab number (250 bridges named slN exist?)".into())
    }

    fn build(mut self, hosts: usize) -> Result<NetLab, String> {
        let br = self.bridge();
        ip(&["addr", "add", &format!("{}/24", self.gateway()), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..hosts {
            let ns = self.netns(i);
            ip(&["netns", "add", &ns])?;
            self.hosts = i + 1; // from here on Drop removes it
            let (outer, inner) = (self.outer_if(i), format!("sl{}p{i}", self.n));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &br, "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(self)
    }

    fn bridge(&self) -> String {
        format!("sl{}", self.n)
    }

    fn outer_if(&self, host: usize) -> String {
        format!("sl{}h{host}", self.n)
    }

    /// The namespace of host `i`.
    pub fn netns(&self, host: usize) -> String {
        format!("sl{}-h{host}", self.n)
    }

    /// The test process's address on the bridge (where etcd and S3 listen).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.n, 1)
    }

    /// Host `i`'s address.
    pub fn addr(&self, host: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.n, 10 + host as u8)
    }

    /// `program` to run inside host `i`'s network namespace. `nsenter` (not `ip netns exec`)
    /// enters only the network namespace: `ip netns exec` also gives the process a private copy
    /// of the mount table, and a copy that holds a FUSE mount keeps it alive after the test
    /// unmounts it, so the FUSE daemon would wait for that process to exit.
    pub fn command(&self, host: usize, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.netns(host)))
            .arg("--")
            .arg(program);
        c
    }

    /// Takes host `i`'s link down: its packets are dropped from now on.
    pub fn cut(&self, host: usize) -> Result<(), String> {
        ip(&["link", "set", &self.outer_if(host), "down"])
    }

    /// Brings host `i`'s link back.
    pub fn heal(&self, host: usize) -> Result<(), String> {
        ip(&["link", "set", &self.outer_if(host), "up"])
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.hosts {
            let ns = self.netns(i);
            // Processes still in the namespace (a test that failed before stopping them).
            if let Ok(out) = Command::new("ip").args(["netns", "pids", &ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = ip(&["link", "del", &self.outer_if(i)]);
            let _ = ip(&["netns", "del", &ns]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}
