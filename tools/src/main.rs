//! `rnic`: the command a person types.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod dump;
mod perf;

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
        /// Also write the packets to this pcap file (or set RNIC_PCAP).
        #[arg(long, env = "RNIC_PCAP")]
        pcap: Option<PathBuf>,
    },
    /// Bandwidth or latency of RDMA operations between two rnic NICs on
    /// loopback, next to a raw UDP baseline from the same run.
    Perf {
        /// write, read or send.
        #[arg(value_enum)]
        op: perf::Op,
        /// Both sides in this process, on loopback (the only mode so far).
        #[arg(long, default_value_t = true)]
        loopback: bool,
        /// Message size in bytes.
        #[arg(short = 's', long, default_value_t = 65536)]
        size: u32,
        /// Number of messages.
        #[arg(short = 'n', long, default_value_t = 2000)]
        iterations: u64,
        /// Messages outstanding at once.
        #[arg(short = 't', long, default_value_t = 64)]
        tx_depth: u32,
        /// Measure latency, one message at a time.
        #[arg(long)]
        lat: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Perf {
            op,
            loopback: _,
            size,
            iterations,
            tx_depth,
            lat,
            json,
        } => {
            let o = perf::Options {
                op,
                size,
                iterations,
                tx_depth,
                latency: lat,
                json,
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
        Command::Demo { pcap } => match demo::run(pcap.as_deref()) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("rnic demo: {e}");
                ExitCode::from(2)
            }
        },
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
