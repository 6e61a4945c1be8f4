// Starts an in-process HDFS (one namenode, one datanode: Hadoop's MiniDFSCluster) bound to
// 127.0.0.1 only, for Silt's tests (crates/silt-testkit/src/hdfs.rs starts it).
//
//   java -cp CLASSES:LIB/* MiniHdfs DIR [RPC_PORT [HTTP_PORT]]
//
// Ports default to 0 (the kernel picks free ones, so concurrent clusters never collide). Prints
// `READY rpc=PORT http=PORT` on stdout once the cluster serves requests, then runs until its
// stdin reaches end of file (the test dropped its handle, or the test process died), shuts the
// cluster down and deletes DIR. Any failure exits non-zero, leaving DIR (and the log there).
// Meanwhile a line `safemode enter` or `safemode leave` on stdin puts the namenode into safe
// mode or takes it out, answered by `SAFEMODE on` / `SAFEMODE off` on stdout (`SAFEMODE
// failed: ...` if it could not).
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.protocol.HdfsConstants;

public final class MiniHdfs {
    private static final String LOOPBACK = "127.0.0.1";
    private static volatile MiniDFSCluster cluster;

    public static void main(String[] args) throws Exception {
        if (args.length < 1 || args.length > 3) {
            System.err.println("usage: MiniHdfs DIR [RPC_PORT [HTTP_PORT]]");
            System.exit(2);
        }
        File dir = new File(args[0]).getAbsoluteFile();
        int rpcPort = args.length > 1 ? Integer.parseInt(args[1]) : 0;
        int httpPort = args.length > 2 ? Integer.parseInt(args[2]) : 0;

        // stdout carries only the READY line: whatever Hadoop prints goes to stderr (the log).
        PrintStream ready = System.out;
        System.setOut(System.err);
        // MiniDFSCluster and Hadoop's test helpers put files under test.build.data (default
        // ./target/test/data): keep everything inside DIR.
        System.setProperty("test.build.data", new File(dir, "test-data").getPath());
        System.setProperty("hadoop.tmp.dir", new File(dir, "tmp").getPath());

        // Watch stdin from the start, so that a parent that goes away during start-up stops us.
        Thread watcher = new Thread(() -> {
            serveCommands(System.in, ready);
            System.exit(0);
        }, "stdin-watcher");
        watcher.setDaemon(true);

        Configuration conf = new HdfsConfiguration();
        conf.set("hadoop.tmp.dir", new File(dir, "tmp").getPath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        // Tests act as any user (WebHDFS's default user is dr.who): no permission checks.
        conf.setBoolean("dfs.permissions.enabled", false);
        // Every listener on loopback; MiniDFSCluster uses these for the datanode as well.
        conf.set("dfs.namenode.rpc-address", LOOPBACK + ":" + rpcPort);
        conf.set("dfs.namenode.http-address", LOOPBACK + ":" + httpPort);
        conf.set("dfs.namenode.https-address", LOOPBACK + ":0");
        conf.set("dfs.namenode.backup.address", LOOPBACK + ":0");
        conf.set("dfs.namenode.backup.http-address", LOOPBACK + ":0");
        conf.set("dfs.namenode.secondary.http-address", LOOPBACK + ":0");
        conf.set("dfs.namenode.secondary.https-address", LOOPBACK + ":0");
        conf.set("dfs.datanode.address", LOOPBACK + ":0");
        conf.set("dfs.datanode.http.address", LOOPBACK + ":0");
        conf.set("dfs.datanode.https.address", LOOPBACK + ":0");
        conf.set("dfs.datanode.ipc.address", LOOPBACK + ":0");
        // The datanode registers under this name, and WebHDFS redirects (CREATE, OPEN, APPEND)
        // name the datanode by it: clients must be sent to 127.0.0.1, not the machine's name.
        conf.set("dfs.datanode.hostname", LOOPBACK);
        conf.setBoolean("dfs.client.use.datanode.hostname", true);
        conf.setBoolean("dfs.datanode.use.datanode.hostname", true);
        // One datanode: a single replica, and no waiting for more datanodes in safe mode.
        conf.setInt("dfs.replication", 1);
        conf.setInt("dfs.namenode.safemode.min.datanodes", 0);
        conf.setInt("dfs.namenode.safemode.extension", 0);

        // Registered before start-up, so that an end of stdin at any point still cleans up.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            MiniDFSCluster running = cluster;
            if (running != null) {
                try {
                    running.shutdown(true);
                } catch (Throwable e) {
                    e.printStackTrace();
                }
            }
            deleteTree(dir.toPath());
        }, "shutdown"));
        watcher.start();
        try {
            cluster = new MiniDFSCluster.Builder(conf, new File(dir, "dfs"))
                .numDataNodes(1)
                .nameNodePort(rpcPort)
                .nameNodeHttpPort(httpPort)
                .hosts(new String[] {LOOPBACK})
                .build();
            cluster.waitActive();
        } catch (Throwable e) {
            e.printStackTrace();
            // halt, not exit: no shutdown hook, DIR and its log stay for the caller to read.
            Runtime.getRuntime().halt(1);
            return;
        }
        int rpc = cluster.getNameNodePort();
        int http = cluster.getNameNode().getHttpAddress().getPort();
        ready.println("READY rpc=" + rpc + " http=" + http);
        ready.flush();
        watcher.join();
    }

    /** Runs the commands read from `in` until its end; other lines are ignored. */
    private static void serveCommands(InputStream in, PrintStream out) {
        BufferedReader lines = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
        try {
            for (String line = lines.readLine(); line != null; line = lines.readLine()) {
                String cmd = line.trim();
                if (cmd.equals("safemode enter") || cmd.equals("safemode leave")) {
                    boolean enter = cmd.endsWith("enter");
                    String answer;
                    try {
                        MiniDFSCluster running = cluster;
                        if (running == null) {
                            throw new IllegalStateException("the cluster is not up yet");
                        }
                        running.getNameNodeRpc().setSafeMode(enter
                            ? HdfsConstants.SafeModeAction.SAFEMODE_ENTER
                            : HdfsConstants.SafeModeAction.SAFEMODE_LEAVE, false);
                        answer = enter ? "SAFEMODE on" : "SAFEMODE off";
                    } catch (Throwable e) {
                        e.printStackTrace();
                        answer = "SAFEMODE failed: " + e;
                    }
                    synchronized (out) {
                        out.println(answer);
                        out.flush();
                    }
                }
            }
        } catch (IOException e) {
            // A broken stdin means the parent is gone too.
        }
    }

    private static void deleteTree(Path root) {
        if (!Files.exists(root)) {
            return;
        }
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            e.printStackTrace();
        }
    }
}
