//! How connections end when their program lets go of them: a dropped
//! connection or request, and a process that ends, tell the peer as the
//! kernel's CM would (a DREQ, a REJ), so the peer's program is never left
//! waiting for a disconnection that cannot come.

use std::io;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use rnic_verbs::*;

const WAIT: Duration = Duration::from_secs(10);

fn qp(dev: &Device) -> (ProtectionDomain, CompletionQueue, QueuePair) {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    (pd, cq, qp)
}

/// A connection dropped without [`Connection::disconnect`] is closed with
/// a DREQ: the peer's wait for the disconnection ends. A request dropped
/// unanswered is refused with reason 28.
#[test]
fn a_dropped_connection_or_request_is_closed_for_the_peer() {
    let (a, b) = (
        Device::open_loopback().unwrap(),
        Device::open_loopback().unwrap(),
    );
    let listener = b.listen(0).unwrap();
    let to = SocketAddr::new(b.addr(), listener.port());
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let (_pd, _cq, qp) = qp(&b);
            let conn = listener.next(WAIT).unwrap().accept(&qp, &[], WAIT).unwrap();
            conn.wait_disconnect(WAIT).unwrap();
            // The second request: dropped unanswered.
            drop(listener.next(WAIT).unwrap());
        });
        let (_pd, _cq, first) = qp(&a);
        let conn = a.connect(&first, to, b"", WAIT).unwrap();
        drop(conn);
        let (_pd2, _cq2, second) = qp(&a);
        let e = a.connect(&second, to, b"", WAIT).unwrap_err();
        server.join().unwrap();
        match e {
            Error::Io(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
                assert!(e.to_string().contains("reason 28"), "{e}");
            }
            e => panic!("{e}"),
        }
    });
    assert_eq!(
        a.cm_connections().unwrap(),
        1,
        "the first in timewait, the refused one gone"
    );
}

/// The child process: connects to `RNIC_CM_CLOSE_PEER` and ends as
/// `RNIC_CM_CLOSE_HOW` says, without waiting for its DREQ's answer.
#[test]
fn closing_process() {
    let (Ok(peer), Ok(how)) = (
        std::env::var("RNIC_CM_CLOSE_PEER"),
        std::env::var("RNIC_CM_CLOSE_HOW"),
    ) else {
        return; // run by the test below, as a process of its own
    };
    let to: SocketAddr = peer.parse().unwrap();
    let dev = Device::open_loopback().unwrap();
    let (_pd, _cq, qp) = qp(&dev);
    let conn = dev.connect(&qp, to, b"", WAIT).unwrap();
    match how.as_str() {
        // Ends with the connection up, as a program that exits without
        // destroying its IDs.
        "exit" => {
            std::mem::forget(conn);
        }
        // Disconnects, but its DREQ is lost: the one DREQ a kernel CM
        // would send for it, had it destroyed the ID.
        "lost-dreq" => {
            dev.set_impairment(Impairment {
                loss: 1.0,
                ..Impairment::default()
            })
            .unwrap();
            assert!(conn.disconnect(Duration::from_millis(100)).is_err());
            dev.set_impairment(Impairment::default()).unwrap();
        }
        h => panic!("{h}"),
    }
    println!("closing");
    std::process::exit(0);
}

#[test]
fn a_process_that_ends_closes_its_connections_even_when_a_dreq_is_lost() {
    for how in ["exit", "lost-dreq"] {
        let dev = Device::open_loopback().unwrap();
        let listener = dev.listen(0).unwrap();
        let to = SocketAddr::new(dev.addr(), listener.port());
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "closing_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RNIC_CM_CLOSE_PEER", to.to_string())
            .env("RNIC_CM_CLOSE_HOW", how)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (_pd, _cq, qp) = qp(&dev);
        let conn = listener.next(WAIT).and_then(|i| i.accept(&qp, &[], WAIT));
        // Not WAIT: the child's own DREQ retry would come after about 4 s
        // had it lived; only what its exit sends can end this wait.
        let closed = conn.map(|c| c.wait_disconnect(Duration::from_secs(3)));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            matches!(closed, Ok(Ok(()))),
            "{how}: {closed:?}\n{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("closing"), "{how}: {said}");
    }
}
