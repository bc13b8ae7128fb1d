//! `vkllm selftest`: it passes on the CPU (every instruction set here) and
//! on Vulkan (lavapipe in CI), and a deliberately broken kernel fails it.

mod common;

use serde_json::Value;
use std::process::{Command, Output};
use vkllm::selftest::{self, Op};

fn vkllm(args: &[&str]) -> Output {
    common::hold_vulkan_lock();
    Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("run the vkllm binary")
}

/// The JSON report's rows, after checking its exit status.
fn report(args: &[&str], code: i32) -> Vec<Value> {
    let o = vkllm(args);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{args:?}: stderr {stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(v["pass"], Value::Bool(code == 0), "{stdout}");
    v["rows"].as_array().expect("rows").clone()
}

fn all_pass(rows: &[Value]) {
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r["pass"], Value::Bool(true), "{r}");
        let (e, b) = (r["max_error"].as_f64(), r["bound"].as_f64());
        assert!(e.unwrap() <= b.unwrap(), "{r}");
    }
}

#[test]
fn selftest_passes_on_every_cpu_instruction_set() {
    let rows = report(&["selftest", "--backend", "cpu", "--json"], 0);
    all_pass(&rows);
    // Each instruction set this CPU has, each op, every weight type.
    for isa in selftest::cpu_isas() {
        let device = format!("cpu-{}", isa.name());
        let mine: Vec<&Value> = rows.iter().filter(|r| r["device"] == device).collect();
        for op in Op::ALL {
            assert!(
                mine.iter()
                    .any(|r| r["op"].as_str().unwrap().starts_with(op.name())),
                "{device}: no {} rows",
                op.name()
            );
        }
        for dtype in vkllm::DType::ALL {
            assert!(
                mine.iter().any(|r| r["dtype"] == dtype.name()),
                "{device}: no {dtype} rows"
            );
        }
    }
    // The table says the same, one line per check after its header.
    let o = vkllm(&["selftest", "--backend", "cpu"]);
    assert_eq!(o.status.code(), Some(0));
    let table = String::from_utf8_lossy(&o.stdout);
    assert_eq!(table.lines().count(), rows.len() + 1, "{table}");
    assert!(table.lines().skip(1).all(|l| l.ends_with(" pass")));
}

#[test]
fn selftest_passes_on_vulkan() {
    // Skipped without a device (a failure with VKLLM_REQUIRE_VULKAN=1).
    if common::vulkan_backend().is_none() {
        return;
    }
    let rows = report(&["selftest", "--backend", "vulkan", "--json"], 0);
    all_pass(&rows);
    for variant in ["gemv-f32-workgroup", "gemv-f32-subgroup", "gemm-tiles"] {
        assert!(
            rows.iter()
                .any(|r| r["op"].as_str().unwrap().contains(variant)),
            "no {variant} rows"
        );
    }
    for op in [
        "attention decode-splits",
        "attention prefill-flash",
        "rms_norm",
    ] {
        assert!(
            rows.iter()
                .any(|r| r["op"].as_str().unwrap().starts_with(op)),
            "no {op} rows"
        );
    }
}

#[test]
fn a_broken_kernel_fails_the_selftest() {
    // The CLI: exit status 1, the broken op's rows fail, the others pass.
    let rows = report(
        &[
            "selftest",
            "--backend",
            "cpu",
            "--json",
            "--break-op",
            "matmul",
        ],
        1,
    );
    for r in &rows {
        let matmul = r["op"].as_str().unwrap().starts_with("matmul");
        assert_eq!(r["pass"], Value::Bool(!matmul), "{r}");
    }
    let o = vkllm(&["selftest", "--backend", "cpu", "--break-op", "attention"]);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.starts_with("error: self-test failed"), "{stderr}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(" FAIL"));
    // Through the library, every op's every row.
    let isa = selftest::cpu_isas()[0];
    for op in Op::ALL {
        let opts = selftest::Options { break_op: Some(op) };
        let rows = selftest::run_cpu(isa, &opts).unwrap();
        for r in &rows {
            assert_eq!(r.pass, !r.op.starts_with(op.name()), "{op:?}: {r:?}");
        }
    }
}

#[test]
fn selftest_rejects_an_unknown_backend() {
    let o = vkllm(&["selftest", "--backend", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("expected all, cpu, vulkan"), "{stderr}");
}
