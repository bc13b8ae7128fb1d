//! `vkllm selftest`: every kernel this machine would run against the scalar
//! reference (the checks live in `vkllm::selftest`); a table, exit status 1
//! on any failure.

use clap::{Args, ValueEnum};
use serde::Serialize;
use vkllm::open::BackendChoice;
use vkllm::selftest::{self, Op, Row};
use vkllm::{Error, Result};

#[derive(Args)]
pub struct SelftestArgs {
    /// What to test: all (every CPU instruction set this CPU has and every
    /// Vulkan device), cpu, vulkan (the preferred device), vulkan:DEVICE
    /// (an index or a name); auto is all
    #[arg(short = 'b', long, value_name = "BACKEND", default_value = "all", value_parser = parse_target)]
    backend: Target,
    /// One JSON object instead of the table
    #[arg(long)]
    json: bool,
    /// Test-only: corrupt one output of every run of this op, as a broken
    /// kernel would, to show that the self-test catches it
    #[arg(long, value_enum, value_name = "OP", hide = true)]
    break_op: Option<BreakOp>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    All,
    One(BackendChoice),
}

fn parse_target(s: &str) -> std::result::Result<Target, String> {
    match s.trim() {
        "all" => Ok(Target::All),
        other => match super::parse_backend(other) {
            Ok(BackendChoice::Auto) => Ok(Target::All),
            Ok(choice) => Ok(Target::One(choice)),
            Err(_) => Err(format!(
                "unknown backend '{other}': expected all, cpu, vulkan or vulkan:DEVICE (an \
                 index or a name)"
            )),
        },
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BreakOp {
    Matmul,
    Linear,
    RmsNorm,
    LayerNorm,
    Attention,
}

impl From<BreakOp> for Op {
    fn from(b: BreakOp) -> Op {
        match b {
            BreakOp::Matmul => Op::Matmul,
            BreakOp::Linear => Op::Linear,
            BreakOp::RmsNorm => Op::RmsNorm,
            BreakOp::LayerNorm => Op::LayerNorm,
            BreakOp::Attention => Op::Attention,
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    pass: bool,
    failed: usize,
    rows: &'a [Row],
}

pub fn run(a: SelftestArgs) -> Result<()> {
    let opts = selftest::Options {
        break_op: a.break_op.map(Op::from),
    };
    let (cpu, vulkan) = match &a.backend {
        Target::All => (true, Some(None)),
        Target::One(BackendChoice::Cpu) => (true, None),
        Target::One(BackendChoice::Device(d)) => (false, Some(Some(d.clone()))),
        Target::One(_) => (false, Some(None)),
    };
    let mut rows = Vec::new();
    if cpu {
        for isa in selftest::cpu_isas() {
            let device = format!("cpu-{}", isa.name());
            collect(&mut rows, &device, selftest::run_cpu(isa, &opts));
        }
    }
    if let Some(device) = vulkan {
        let base = vkllm::vk::Options::from_env()?;
        // `all`: every device there is (none is no failure unless
        // VKLLM_REQUIRE_VULKAN=1); otherwise the one asked for.
        let devices: Vec<Option<String>> = match (&a.backend, device) {
            (Target::All, _) => match vkllm::vk::list_devices() {
                Ok(list) => list.iter().map(|d| Some(d.index.to_string())).collect(),
                Err(e) if !vkllm::vk::vulkan_required() => {
                    eprintln!("no Vulkan device tested: {e}");
                    Vec::new()
                }
                Err(e) => return Err(e),
            },
            (_, d) => vec![d.or(base.device.clone())],
        };
        for device in devices {
            let name = format!("vulkan:{}", device.as_deref().unwrap_or("default"));
            let vk_opts = vkllm::vk::Options {
                device,
                ..base.clone()
            };
            collect(&mut rows, &name, selftest::run_vulkan(&vk_opts, &opts));
        }
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    if a.json {
        super::print_json(&Report {
            pass: failed == 0,
            failed,
            rows: &rows,
        })?;
    } else {
        super::print_flush(&selftest::table(&rows))?;
    }
    if failed > 0 {
        return Err(Error::Invalid(format!(
            "self-test failed: {failed} of {} kernel checks out of bounds",
            rows.len()
        )));
    }
    eprintln!("self-test passed: {} kernel checks", rows.len());
    Ok(())
}

/// A device's rows, or one failing row naming the error that stopped it
/// (a driver that cannot run a kernel fails the test as a wrong one does).
fn collect(rows: &mut Vec<Row>, device: &str, r: Result<Vec<Row>>) {
    match r {
        Ok(v) => rows.extend(v),
        Err(e) => rows.push(Row {
            device: device.to_string(),
            op: format!("error: {e}"),
            dtype: "-".into(),
            max_error: f64::INFINITY,
            bound: 0.0,
            pass: false,
        }),
    }
}
