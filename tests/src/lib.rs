//! Cross-crate tests live in `tests/`; this library holds what the tests
//! that boot the rdma_rxe VM (`rxe_vm.rs`, `cm_hostile_vm.rs`) share.

pub mod vm {
    //! The host's side of a VM test: the repository, `ip`, a namespace
    //! with its share directory and children, and the tap's capture.

    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// The repository's top directory.
    pub fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// Run `ip ARGS`, which must succeed.
    pub fn ip(args: &[&str]) {
        let ok = Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {}", args.join(" "));
    }

    /// Build the VM (`interop/rxe-vm/build` makes only what is missing).
    pub fn build() {
        let built = Command::new(repo().join("interop/rxe-vm/build"))
            .stdout(Stdio::null())
            .status()
            .expect("run interop/rxe-vm/build");
        assert!(built.success(), "interop/rxe-vm/build failed");
    }

    /// The namespace, a share directory and the children, all gone when
    /// dropped (the share kept if `keep`).
    pub struct Setup {
        /// The network namespace the tap is in.
        pub ns: String,
        /// The directory the guest sees at /mnt/host.
        pub share: PathBuf,
        /// tcpdump, the VM, and whatever else is to be killed.
        pub children: Vec<Child>,
        /// Keep `share` (its capture and logs) when dropped.
        pub keep: bool,
    }

    impl Setup {
        /// Namespace `rnic-TAG-PID` with its loopback up, and a share
        /// directory of that name (with `out/`) in the temporary directory.
        pub fn new(tag: &str, keep: bool) -> Setup {
            let name = format!("rnic-{tag}-{}", std::process::id());
            let s = Setup {
                share: std::env::temp_dir().join(&name),
                ns: name,
                children: Vec::new(),
                keep,
            };
            std::fs::create_dir_all(s.share.join("out")).unwrap();
            ip(&["netns", "add", &s.ns]);
            ip(&["-n", &s.ns, "link", "set", "lo", "up"]);
            s
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
            if !self.keep {
                let _ = std::fs::remove_dir_all(&self.share);
            }
        }
    }

    /// Wait (at most `limit`) until `path` exists.
    pub fn wait_for(path: &Path, limit: Duration) -> bool {
        let t0 = Instant::now();
        while !path.exists() {
            if t0.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// tcpdump on `tap` in namespace `ns`, every RoCE v2 packet into
    /// `pcap`; returns once the file exists (at most 10 s).
    pub fn capture(ns: &str, tap: &str, pcap: &Path) -> Child {
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "tcpdump", "-Z", "root"])
            // Each packet handed to tcpdump as it arrives and written at
            // once: without immediate mode libpcap hands over a buffer when
            // it fills or a second has passed, and a last case of small
            // packets could reach the file after it was read.
            .args(["--immediate-mode", "-U", "-n", "-s", "0"])
            .args(["-i", tap, "-w"])
            .arg(pcap)
            .args(["udp", "port", "4791"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump");
        wait_for(pcap, Duration::from_secs(10));
        child
    }

    /// Wait until the capture at `pcap` has stopped growing (at most 20 s):
    /// it ends with the VM, and tcpdump writes each packet as it goes.
    pub fn settled(pcap: &Path) {
        let size = || std::fs::metadata(pcap).map(|m| m.len()).unwrap_or(0);
        let t0 = Instant::now();
        let mut last = size();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = size();
            if now == last || t0.elapsed() > Duration::from_secs(20) {
                break;
            }
            last = now;
        }
    }
}
