//! `rnic`: the command a person types.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod demo;
mod dump;
mod exec;
mod ladder;
mod perf;
mod pingpong;
mod scenario;
mod soak;
mod sysfs;

#[derive(Parser)]
#[command(name = "rnic", version, about = "A RoCE v2 RDMA NIC made of software")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Two software NICs in this process, on loopback: one of each RDMA
    /// operation, told step by step, with the packets on the wire.
    Demo {
        /// Also write the packets to this pcap file (RNIC_PCAP=FILE does the
        /// same for any program using rnic).
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// Tell a scenario of what goes wrong instead (a lost packet, no
        /// receive posted, a bad key...), on the simulator: the same
        /// output every run. --list shows them.
        #[arg(long)]
        scenario: Option<String>,
        /// List the scenarios.
        #[arg(long)]
        list: bool,
        /// Also draw the packets as a ladder diagram, FILE.svg or FILE.html
        /// (see rnic ladder).
        #[arg(long)]
        ladder: Option<PathBuf>,
    },
    /// Bandwidth or latency of RDMA operations between two rnic NICs, in this
    /// process (--loopback, the default) or in two (--server, --client HOST),
    /// next to a raw UDP baseline between the same addresses.
    Perf {
        /// write, read, send or atomic (FETCH_AND_ADD).
        #[arg(value_enum)]
        op: perf::Op,
        /// Both NICs in this process, on loopback addresses (the default).
        #[arg(long, conflicts_with_all = ["server", "client"])]
        loopback: bool,
        /// Wait for a client (which sets the options for both).
        #[arg(long, conflicts_with = "client")]
        server: bool,
        /// Connect to the server on HOST.
        #[arg(long, value_name = "HOST")]
        client: Option<String>,
        /// TCP port of the exchange between server and client.
        #[arg(short = 'p', long, default_value_t = 18515)]
        port: u16,
        /// Message size in bytes (atomics: 8).
        #[arg(short = 's', long, default_value_t = 65536)]
        size: u32,
        /// Messages per size and direction.
        #[arg(short = 'n', long, default_value_t = 2000)]
        iterations: u64,
        /// Run for this many seconds instead of a number of messages.
        #[arg(short = 'D', long)]
        duration: Option<f64>,
        /// Queue pairs, requests spread over them.
        #[arg(short = 'q', long, default_value_t = 1)]
        qps: u32,
        /// Messages outstanding at once, per queue pair.
        #[arg(short = 't', long, default_value_t = 64)]
        tx_depth: u32,
        /// READs and atomics outstanding at once per queue pair, each
        /// way (max_rd_atomic); the device's maximum if not given.
        #[arg(short = 'o', long, value_parser = clap::value_parser!(u8).range(1..))]
        outs: Option<u8>,
        /// Measure latency, one message at a time (WRITE, SEND: half a
        /// ping-pong round trip; READ, atomics: post to completion).
        #[arg(long)]
        lat: bool,
        /// Both directions at once.
        #[arg(short = 'b', long)]
        bidir: bool,
        /// Every size from 2 bytes to 8 MiB, doubling.
        #[arg(short = 'a', long)]
        all_sizes: bool,
        /// Path MTU: 256, 512, 1024, 2048 or 4096; the port's active MTU if
        /// not given, as perftest does.
        #[arg(short = 'm', long, value_parser = parse_mtu)]
        mtu: Option<rnic_verbs::Mtu>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
        /// Impair each NIC's egress, for example
        /// loss=5%,dup=1%,reorder=2%,corrupt=0.1%,delay=1ms,seed=7
        /// (RNIC_IMPAIR does the same for any program on rnic).
        #[arg(long, value_name = "SPEC")]
        impair: Option<rnic_verbs::Impairment>,
        /// Connect the queue pairs through the connection manager (REQ,
        /// REP, RTU on QP1), as perftest's -R does: the server listens on
        /// the rdma_cm port of the TCP port's number, each side's buffer
        /// goes in the private data, and the path MTU and outstanding
        /// READs are what the CM sets (the port's active MTU, 16).
        #[arg(long, conflicts_with_all = ["mtu", "outs"])]
        cm: bool,
    },
    /// In one run on loopback: rnic's bandwidth (WRITE, READ, SEND; 1 and 8
    /// QPs; 64 B to 1 MiB), round trips and message rate beside a TCP
    /// stream, raw UDP (per call, sendmmsg, GSO/GRO) and UDP and TCP
    /// ping-pongs; a table, bench.json and bench.png.
    Bench {
        /// Where bench.json and bench.png go.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
        /// Seconds per bandwidth figure.
        #[arg(short = 'D', long, default_value_t = 0.5)]
        duration: f64,
        /// Every figure once, small and short (a few seconds).
        #[arg(long)]
        quick: bool,
    },
    /// Minutes of mixed traffic on many RC connections between two NICs on
    /// loopback, both ways, on impaired links, connections remade all the
    /// time: every byte, atomic result and completion checked against a
    /// model; a stuck connection, growing memory or growing tables fail it.
    Soak {
        /// Seconds of new work (then everything drains).
        #[arg(short = 'D', long, default_value_t = 600.0)]
        duration: f64,
        /// Connections.
        #[arg(short = 'q', long, default_value_t = 64)]
        qps: usize,
        /// Work requests outstanding per side of each connection.
        #[arg(short = 't', long, default_value_t = 8)]
        depth: usize,
        /// Largest message in bytes (sizes are drawn from 0 up).
        #[arg(short = 's', long, default_value_t = 8192)]
        max_size: usize,
        /// Path MTU: 256, 512, 1024, 2048 or 4096.
        #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
        mtu: rnic_verbs::Mtu,
        /// Each NIC's egress impairment ("none" for a clean link).
        #[arg(long, default_value = soak::DEFAULT_IMPAIR, value_name = "SPEC")]
        impair: String,
        /// Milliseconds between two connections drained, checked and made
        /// again (0: never).
        #[arg(long, default_value_t = 100)]
        churn_ms: u64,
        /// Seconds without progress that make a connection stuck.
        #[arg(long, default_value_t = 30)]
        stall: u64,
        /// Seed of the operations, sizes and contents.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Seconds between progress lines.
        #[arg(long, default_value_t = 10.0)]
        report: f64,
        /// Record every packet both NICs send, as they send it (before the
        /// impairment), in this pcap file: `rnic check FILE` judges it.
        #[arg(long, value_name = "FILE")]
        pcap: Option<std::path::PathBuf>,
    },
    /// Like ibv_rc_pingpong: with no SERVER, wait for a client; with one,
    /// connect to it. The two exchange endpoints over TCP in ibv_rc_pingpong's
    /// format, then bounce SENDs.
    Pingpong {
        /// The server to connect to.
        server: Option<String>,
        /// TCP port of the endpoint exchange.
        #[arg(short = 'p', long, default_value_t = 18515)]
        port: u16,
        /// Message size.
        #[arg(short = 's', long, default_value_t = 4096)]
        size: u32,
        /// Round trips.
        #[arg(short = 'n', long, default_value_t = 1000)]
        iters: u64,
        /// Path MTU: 256, 512, 1024, 2048 or 4096. 1024 if not given, as
        /// ibv_rc_pingpong, which does not tell its peer its MTU: the two
        /// sides must agree without saying.
        #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
        mtu: rnic_verbs::Mtu,
        /// Run the NIC on this network interface, at every address it has
        /// (its GID table), with the frame transport (needs CAP_NET_RAW): to
        /// talk to rdma_rxe or a hardware RoCE NIC. Without it, on a
        /// loopback address.
        #[arg(long)]
        iface: Option<String>,
        /// The local GID to use, by index in the port's table (as
        /// ibv_rc_pingpong's -g): with --iface, IPv6 or IPv4. By default,
        /// the device's own address (the interface's first IPv4 address).
        #[arg(short = 'g', long = "gid-idx")]
        gid_index: Option<usize>,
        /// The first PSN this side sends (24 bits; 0x prefix for hex),
        /// instead of a random one: 0xffff00 makes a run cross the wrap.
        #[arg(long, value_parser = parse_psn)]
        psn: Option<rnic_wire::Psn>,
        /// Connect through the communication manager on QP1 (REQ, REP,
        /// RTU), by address and rdma_cm port (-p), as rdma_cm programs do,
        /// instead of exchanging QP numbers over TCP.
        #[arg(long)]
        cm: bool,
    },
    /// Run an unmodified verbs program (ibv_rc_pingpong, ib_write_bw, your
    /// own) on rnic: its libibverbs.so.1 is rnic's drop-in library.
    Exec {
        /// The devices the program sees, as NAME=ADDR,NAME=ADDR (sets
        /// RNIC_DEVICES); by default one, rnic0, on the first free loopback
        /// address.
        #[arg(long, value_name = "NAME=ADDR,...")]
        devices: Option<String>,
        /// Show the devices as a kernel's RDMA devices appear, in a private
        /// mount namespace of the program: /sys/class/infiniband (GIDs, GID
        /// types, network devices, what libibumad reads) and
        /// /dev/infiniband/uverbsN (UCX looks for it). Needs root or
        /// unprivileged user namespaces.
        #[arg(long)]
        sysfs: bool,
        /// Run the default device on this network interface, at every
        /// address it has (its GID table: the IPv6 link-local address, the
        /// IPv4 addresses, the other IPv6 addresses, as on a RoCE port),
        /// with the frame transport (sets RNIC_IFACE; needs CAP_NET_RAW): to
        /// talk to rdma_rxe or a hardware RoCE NIC.
        #[arg(long)]
        iface: Option<String>,
        /// The program.
        program: std::ffi::OsString,
        /// Its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// What a NIC is and supports, like ibv_devinfo -v.
    Devinfo {
        /// The NIC on this network interface (the frame transport, as
        /// `rnic pingpong --iface`): its GID table is the interface's
        /// addresses. Without it, a NIC on a loopback address.
        #[arg(long)]
        iface: Option<String>,
    },
    /// The environment variables rnic reads: each one's value here, its
    /// default and what it does; an error if a device could not start with
    /// them.
    Config {
        /// Print the table of every variable as Markdown (the README's).
        #[arg(long)]
        markdown: bool,
    },
    /// An IBTA conformance verdict for a capture (pcap or pcapng) of any
    /// NIC's RoCE v2 traffic: every RC connection's PSNs, ACKs, NAKs, MSNs,
    /// retransmissions, READ responses and atomics rebuilt from the packets
    /// and held to the transport's rules. Exits 1 on a violation.
    Check {
        /// The capture file.
        file: PathBuf,
    },
    /// A sequence diagram of a capture: a lifeline per endpoint (address
    /// and QP), an arrow per packet; SVG, or one self-contained HTML file
    /// that stays usable for a large capture.
    Ladder {
        /// The capture file.
        file: PathBuf,
        /// Where to write it: FILE.svg or FILE.html.
        #[arg(short, long)]
        output: PathBuf,
        /// Only packets to or from this QP (hex, 0x11).
        #[arg(long, value_parser = parse_hex)]
        qp: Option<u32>,
        /// Only PSNs in this range (hex: 0x100-0x1ff).
        #[arg(long, value_parser = parse_hex_range)]
        psn: Option<(u32, u32)>,
        /// Only packets in this time range, in seconds from the first (0.001-0.5).
        #[arg(long, value_parser = parse_time_range)]
        time: Option<(f64, f64)>,
        /// Draw every packet: fold no runs of one opcode.
        #[arg(long)]
        no_fold: bool,
    },
    /// Decode the RoCE v2 packets of a capture (pcap or pcapng), one line each,
    /// checking every ICRC.
    Dump {
        /// The capture file.
        file: PathBuf,
        /// Print every header field as a tree under each packet.
        #[arg(short, long)]
        verbose: bool,
        /// Exit non-zero when any ICRC is bad or any RoCE v2 packet is malformed.
        #[arg(long)]
        check: bool,
        /// Print only the summary.
        #[arg(short, long)]
        quiet: bool,
    },
}

fn parse_hex(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("{s}: {e}"))
}

fn parse_hex_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    Ok((parse_hex(a)?, parse_hex(b)?))
}

fn parse_time_range(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let f = |v: &str| v.parse::<f64>().map_err(|e| format!("{v}: {e}"));
    Ok((f(a)?, f(b)?))
}

/// A capture file opened for `rnic COMMAND` to read as a stream, or `None`
/// (said on stderr) if it cannot be.
fn open_capture(command: &str, file: &std::path::Path) -> Option<io::BufReader<std::fs::File>> {
    match std::fs::File::open(file) {
        Ok(f) => Some(io::BufReader::with_capacity(1 << 20, f)),
        Err(e) => {
            eprintln!("rnic {command}: cannot read {}: {e}", file.display());
            None
        }
    }
}

/// A positive, finite number of seconds as a duration.
fn secs(x: f64) -> Option<std::time::Duration> {
    (x.is_finite() && x > 0.0).then(|| std::time::Duration::from_secs_f64(x))
}

fn main() -> ExitCode {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RNIC_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(io::stderr)
            .init();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Perf {
            op,
            loopback: _,
            server,
            client,
            port,
            size,
            iterations,
            duration,
            qps,
            tx_depth,
            outs,
            lat,
            bidir,
            all_sizes,
            mtu,
            json,
            impair,
            cm,
        } => {
            let duration = match duration.map(secs) {
                Some(None) => {
                    eprintln!("rnic perf: the duration must be a positive number of seconds");
                    return ExitCode::from(2);
                }
                d => d.flatten(),
            };
            let mode = match (server, client) {
                (true, _) => perf::Mode::Server,
                (false, Some(host)) => perf::Mode::Client(host),
                (false, None) => perf::Mode::Loopback,
            };
            let mtu_of_port = mtu.is_none();
            let mtu = match mtu.map_or_else(perf::port_mtu, Ok) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("rnic perf: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let o = perf::Options {
                op,
                mode,
                port,
                size,
                iterations,
                duration,
                qps,
                tx_depth,
                latency: lat,
                bidir,
                all_sizes,
                mtu,
                mtu_of_port,
                json,
                quiet: false,
                impair,
                outs,
                cm,
            };
            match perf::run(&o) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("rnic perf: some operations failed");
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("rnic perf: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Bench {
            out,
            duration,
            quick,
        } => {
            let mut o = if quick {
                bench::Options::quick(out)
            } else {
                bench::Options::full(out)
            };
            if !quick {
                if !(duration.is_finite() && duration > 0.0) {
                    eprintln!("rnic bench: the duration must be a positive number of seconds");
                    return ExitCode::from(2);
                }
                o.time = std::time::Duration::from_secs_f64(duration);
            }
            match bench::run(&o) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("rnic bench: some rnic operations failed");
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("rnic bench: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Pingpong {
            server,
            port,
            size,
            iters,
            mtu,
            iface,
            gid_index,
            psn,
            cm,
        } => {
            let o = pingpong::Options {
                server,
                port,
                size,
                iters,
                mtu,
                iface,
                gid_index,
                psn,
                cm,
            };
            match pingpong::run(&o) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rnic pingpong: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Config { markdown } => {
            if markdown {
                print!("{}", rnic_verbs::config::markdown_table());
                return ExitCode::SUCCESS;
            }
            for v in rnic_verbs::config::VARIABLES {
                let now = match std::env::var_os(v.name) {
                    Some(value) => format!("{}={:?}", v.name, value.to_string_lossy()),
                    None => format!("{} (unset: {})", v.name, v.default),
                };
                println!("{now}\n    {} Read by {}.", v.meaning, v.read_by.name());
            }
            match rnic_verbs::Config::from_env() {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rnic config: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Exec {
            devices,
            sysfs,
            iface,
            program,
            args,
        } => {
            if let Some(i) = iface {
                // Set before any thread starts; the program exec'd next
                // inherits it.
                std::env::set_var("RNIC_IFACE", i);
            }
            let e = exec::run(&program, &args, devices.as_deref(), sysfs);
            eprintln!("rnic exec: {e}");
            ExitCode::from(127)
        }
        Command::Soak {
            duration,
            qps,
            depth,
            max_size,
            mtu,
            impair,
            churn_ms,
            stall,
            seed,
            report,
            pcap,
        } => {
            let impair = if impair == "none" {
                None
            } else {
                match impair.parse::<rnic_verbs::Impairment>() {
                    Ok(i) => Some(i),
                    Err(e) => {
                        eprintln!("rnic soak: --impair: {e}");
                        return ExitCode::from(2);
                    }
                }
            };
            let (Some(duration), Some(report)) = (secs(duration), secs(report)) else {
                eprintln!("rnic soak: durations must be positive numbers of seconds");
                return ExitCode::from(2);
            };
            let o = soak::Options {
                duration,
                qps,
                depth,
                max_size,
                mtu,
                impair,
                churn: std::time::Duration::from_millis(churn_ms),
                stall: std::time::Duration::from_secs(stall.max(1)),
                seed,
                report,
                pcap,
            };
            match soak::run(&o) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("rnic soak: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Devinfo { iface } => match iface.as_deref().map_or_else(
            rnic_verbs::Device::open_loopback,
            rnic_verbs::Device::open_on_interface,
        ) {
            Ok(dev) => {
                let a = dev.query_device();
                let ver = env!("CARGO_PKG_VERSION");
                println!("hca_id:\trnic_{}", dev.addr());
                println!("\ttransport:\t\t\tInfiniBand (0)");
                println!("\tfw_ver:\t\t\t\t{ver}");
                println!("\tvendor_id:\t\t\t0x0000");
                println!("\tphys_port_cnt:\t\t\t1");
                println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
                println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
                println!("\tmax_sge:\t\t\t{}", a.max_sge);
                println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
                println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
                println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
                println!("\tmax_msg_sz:\t\t\t{:#x}", a.max_msg_sz);
                println!("\tmax_inline_data:\t\t{}", a.max_inline_data);
                println!("\tatomic_cap:\t\t\tATOMIC_HCA (1)");
                println!("\t\tport:\t1");
                println!("\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
                let port = dev.query_port();
                let mtu = |m: rnic_verbs::Mtu| format!("{} ({})", m.bytes(), m as u8 + 1);
                println!("\t\t\tmax_mtu:\t\t{}", mtu(port.max_mtu));
                println!("\t\t\tactive_mtu:\t\t{}", mtu(port.active_mtu));
                println!("\t\t\tlink_layer:\t\tEthernet");
                for (i, a) in dev.gids().iter().enumerate() {
                    println!("\t\t\tGID[{i:>3}]:\t\t{}, RoCE v2", rnic_verbs::gid_of(*a));
                }
                let how = match &iface {
                    Some(i) => format!("frames on {i} (AF_PACKET)"),
                    None => "UDP sockets".to_string(),
                };
                println!(
                    "\t\t\ttransport:\t\tUDP port {}, {how}, engine thread in this process",
                    rnic_wire::ROCE_V2_PORT
                );
                // rdma_rxe treats retry_cnt 7 as "retry forever"; IBTA and rnic do not.
                println!("\t\t\tretry_cnt:\t\t7 means 7 retries (IBTA); rnr_retry 7 means forever");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rnic devinfo: {e}");
                ExitCode::from(2)
            }
        },
        Command::Demo { list: true, .. } => {
            let _ = scenario::list(&mut std::io::stdout().lock());
            ExitCode::SUCCESS
        }
        Command::Demo {
            scenario: Some(name),
            pcap,
            ladder,
            ..
        } => match scenario::run(
            &name,
            pcap.as_deref(),
            ladder.as_deref(),
            &mut std::io::stdout().lock(),
        ) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("rnic demo: {e}");
                ExitCode::from(2)
            }
        },
        Command::Demo { pcap, ladder, .. } => {
            // The ladder is drawn from a capture: the one asked for, or one
            // of its own, removed after.
            let own = (pcap.is_none() && ladder.is_some()).then(|| {
                std::env::temp_dir().join(format!("rnic-demo-{}.pcap", std::process::id()))
            });
            let capture = pcap.clone().or_else(|| own.clone());
            let ran = demo::run(capture.as_deref(), pcap.is_some());
            let drawn = match (&ran, &ladder, &capture) {
                (Ok(_), Some(l), Some(c)) => std::fs::File::open(c)
                    .and_then(|f| ladder::write(f, "rnic demo", &ladder::Options::default(), l))
                    .map(|()| println!("  ladder diagram written to {}", l.display())),
                _ => Ok(()),
            };
            if let Some(own) = own {
                let _ = std::fs::remove_file(own);
            }
            match (ran, drawn) {
                (Ok(true), Ok(())) => ExitCode::SUCCESS,
                (Ok(false), _) => ExitCode::from(1),
                (Err(e), _) => {
                    eprintln!("rnic demo: {e}");
                    ExitCode::from(2)
                }
                (_, Err(e)) => {
                    eprintln!("rnic demo: ladder: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Ladder {
            file,
            output,
            qp,
            psn,
            time,
            no_fold,
        } => {
            let Some(input) = open_capture("ladder", &file) else {
                return ExitCode::from(2);
            };
            let opts = ladder::Options {
                qp,
                psn,
                time,
                no_fold,
            };
            match ladder::write(input, &file.display().to_string(), &opts, &output) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rnic ladder: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check { file } => {
            let Some(input) = open_capture("check", &file) else {
                return ExitCode::from(2);
            };
            let stdout = io::stdout();
            let mut out = io::BufWriter::new(stdout.lock());
            let name = file.display().to_string();
            match check::check(input, &name, &mut out).and_then(|v| {
                out.flush()?;
                Ok(v)
            }) {
                Ok(v) if v.violations > 0 => ExitCode::from(1),
                Ok(v) if v.file_error => ExitCode::from(2),
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rnic check: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Dump {
            file,
            verbose,
            check,
            quiet,
        } => {
            let data = match std::fs::read(&file) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("rnic dump: cannot read {}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            let opts = dump::Options { verbose, quiet };
            let stdout = io::stdout();
            let mut out = io::BufWriter::new(stdout.lock());
            let result = dump::dump(&data, &opts, &mut out).and_then(|s| {
                out.flush()?;
                Ok(s)
            });
            match result {
                Ok(summary) => {
                    if check && !summary.all_good() {
                        eprintln!(
                            "rnic dump --check: {} bad ICRC, {} malformed RoCE v2 packet(s), {}",
                            summary.icrc_bad,
                            summary.malformed,
                            if summary.file_error.is_some() {
                                "file error"
                            } else {
                                "file read whole"
                            }
                        );
                        return ExitCode::from(1);
                    }
                    ExitCode::SUCCESS
                }
                // Output cut short by the reader (`rnic dump f | head`): not an error.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rnic dump: {}: {e}", file.display());
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// A path MTU on the command line, in bytes.
fn parse_mtu(s: &str) -> Result<rnic_verbs::Mtu, String> {
    s.parse()
        .ok()
        .and_then(rnic_verbs::Mtu::from_bytes)
        .ok_or_else(|| format!("{s:?}: the MTU must be 256, 512, 1024, 2048 or 4096"))
}

/// A PSN on the command line: decimal, or hexadecimal after 0x; 24 bits.
fn parse_psn(s: &str) -> Result<rnic_wire::Psn, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    rnic_wire::Psn::try_new(v).ok_or_else(|| format!("{s} does not fit in 24 bits"))
}

#[cfg(test)]
mod tests {
    use super::{parse_mtu, parse_psn};

    #[test]
    fn mtus_on_the_command_line() {
        assert_eq!(parse_mtu("4096"), Ok(rnic_verbs::Mtu::Mtu4096));
        assert_eq!(parse_mtu("256"), Ok(rnic_verbs::Mtu::Mtu256));
        for bad in ["1500", "0", "4k", ""] {
            assert!(parse_mtu(bad).unwrap_err().contains("256, 512"), "{bad}");
        }
    }

    #[test]
    fn psns_on_the_command_line() {
        assert_eq!(parse_psn("0xffff00").unwrap().value(), 0xFF_FF00);
        assert_eq!(parse_psn("16777215").unwrap().value(), 0xFF_FFFF);
        assert!(parse_psn("0x1000000").unwrap_err().contains("24 bits"));
        assert!(parse_psn("wrap").is_err());
    }
}
