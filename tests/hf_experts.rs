//! Mixture-of-experts Hugging Face directories (the tiny qwen3moe, mixtral,
//! gpt_oss and gpt_oss_mxfp4 references) presented under llama.cpp's names:
//! every stacked expert tensor holds exactly the stored values, in the place
//! llama.cpp's converter puts them, read here straight from the safetensors
//! file.

mod common;

use safetensors::SafeTensors;
use std::path::PathBuf;
use vkllm::dtype::DType;
use vkllm::model::hf::HfCheckpoint;
use vkllm::model::source::TensorSource;

const LAYERS: usize = 2;
const HIDDEN: usize = 64;

fn tiny(arch: &str) -> PathBuf {
    common::reference_dir().join("tiny").join(arch)
}

fn stored(arch: &str) -> Vec<u8> {
    std::fs::read(tiny(arch).join("model.safetensors")).unwrap()
}

/// A stored f32 tensor's values and shape.
fn values(st: &SafeTensors, name: &str) -> (Vec<f32>, Vec<usize>) {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
    let v = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (v, t.shape().to_vec())
}

/// A presented tensor: (dtype, rows, cols, values).
fn presented(ck: &HfCheckpoint, name: &str) -> (DType, usize, usize, Vec<f32>) {
    let t = ck
        .tensor(name)
        .unwrap()
        .unwrap_or_else(|| panic!("{name} is not presented; have {:?}", ck.names()));
    let v = t.to_f32(name).unwrap();
    (t.dtype, t.rows, t.cols, v)
}

/// Per-expert 2-D matrices stacked along rows, as llama.cpp stacks them.
fn check_per_expert(
    arch: &str,
    router: &str,
    projections: [(&str, &str); 3],
    experts: usize,
    ff: usize,
) {
    let ck = HfCheckpoint::open(&tiny(arch)).unwrap();
    let bytes = stored(arch);
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let moe = ck.config.moe.expect("config declares experts");
    assert_eq!(
        (moe.experts, moe.used, moe.n_ff, moe.renorm),
        (experts, 2, ff, true)
    );
    for l in 0..LAYERS {
        let (want, shape) = values(&st, &format!("model.layers.{l}.{router}"));
        assert_eq!(shape, [experts, HIDDEN]);
        let (dt, rows, cols, got) = presented(&ck, &format!("blk.{l}.ffn_gate_inp.weight"));
        assert_eq!((dt, rows, cols), (DType::F32, experts, HIDDEN));
        assert_eq!(got, want);
        for (gguf, hf) in projections {
            let (rows_e, cols_e) = if gguf == "down" {
                (HIDDEN, ff)
            } else {
                (ff, HIDDEN)
            };
            let mut want = Vec::new();
            for e in 0..experts {
                let (v, shape) = values(
                    &st,
                    &hf.replace("{l}", &l.to_string())
                        .replace("{e}", &e.to_string()),
                );
                assert_eq!(shape, [rows_e, cols_e]);
                want.extend(v);
            }
            let name = format!("blk.{l}.ffn_{gguf}_exps.weight");
            let (dt, rows, cols, got) = presented(&ck, &name);
            assert_eq!(
                (dt, rows, cols),
                (DType::F32, experts * rows_e, cols_e),
                "{name}"
            );
            assert_eq!(got, want, "{name}");
        }
        // A dense FFN's names must not appear.
        for dense in ["ffn_gate", "ffn_up", "ffn_down"] {
            assert!(ck
                .tensor(&format!("blk.{l}.{dense}.weight"))
                .unwrap()
                .is_none());
        }
    }
}

#[test]
fn qwen3moe_experts_stack_in_expert_order() {
    check_per_expert(
        "qwen3moe",
        "mlp.gate.weight",
        [
            ("gate", "model.layers.{l}.mlp.experts.{e}.gate_proj.weight"),
            ("up", "model.layers.{l}.mlp.experts.{e}.up_proj.weight"),
            ("down", "model.layers.{l}.mlp.experts.{e}.down_proj.weight"),
        ],
        8,
        32,
    );
    let ck = HfCheckpoint::open(&tiny("qwen3moe")).unwrap();
    assert!(ck.config.qk_norm);
    assert!(ck.tensor("blk.0.ffn_norm.weight").unwrap().is_some());
}

#[test]
fn mixtral_experts_stack_w1_w3_w2_as_gate_up_down() {
    check_per_expert(
        "mixtral",
        "block_sparse_moe.gate.weight",
        [
            (
                "gate",
                "model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight",
            ),
            (
                "up",
                "model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight",
            ),
            (
                "down",
                "model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight",
            ),
        ],
        8,
        32,
    );
}

const OSS_EXPERTS: usize = 4;
const OSS_FF: usize = 32;

#[test]
fn gpt_oss_splits_interleaved_gate_up_and_transposes() {
    let (e_n, f_n, h_n) = (OSS_EXPERTS, OSS_FF, HIDDEN);
    let ck = HfCheckpoint::open(&tiny("gpt_oss")).unwrap();
    let bytes = stored("gpt_oss");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for l in 0..LAYERS {
        let p = |leaf: &str| values(&st, &format!("model.layers.{l}.{leaf}"));
        let (gate_up, shape) = p("mlp.experts.gate_up_proj");
        assert_eq!(shape, [e_n, h_n, 2 * f_n]);
        let (down, shape) = p("mlp.experts.down_proj");
        assert_eq!(shape, [e_n, f_n, h_n]);
        let (gate_up_bias, _) = p("mlp.experts.gate_up_proj_bias");
        let (down_bias, _) = p("mlp.experts.down_proj_bias");

        let (dt, rows, cols, gate) = presented(&ck, &format!("blk.{l}.ffn_gate_exps.weight"));
        assert_eq!((dt, rows, cols), (DType::F32, e_n * f_n, h_n));
        let (_, _, _, up) = presented(&ck, &format!("blk.{l}.ffn_up_exps.weight"));
        let (dt, rows, cols, dn) = presented(&ck, &format!("blk.{l}.ffn_down_exps.weight"));
        assert_eq!((dt, rows, cols), (DType::F32, e_n * h_n, f_n));
        for e in 0..e_n {
            for f in 0..f_n {
                for h in 0..h_n {
                    // x @ W: gate_up[e][h][2f] is gate row f, column h.
                    let at = (e * h_n + h) * 2 * f_n + 2 * f;
                    assert_eq!(gate[(e * f_n + f) * h_n + h], gate_up[at]);
                    assert_eq!(up[(e * f_n + f) * h_n + h], gate_up[at + 1]);
                    assert_eq!(dn[(e * h_n + h) * f_n + f], down[(e * f_n + f) * h_n + h]);
                }
            }
        }
        let (_, rows, cols, gb) = presented(&ck, &format!("blk.{l}.ffn_gate_exps.bias"));
        assert_eq!((rows, cols), (e_n, f_n));
        let (_, _, _, ub) = presented(&ck, &format!("blk.{l}.ffn_up_exps.bias"));
        for i in 0..e_n * f_n {
            assert_eq!(gb[i], gate_up_bias[2 * i]);
            assert_eq!(ub[i], gate_up_bias[2 * i + 1]);
        }
        let (_, rows, cols, db) = presented(&ck, &format!("blk.{l}.ffn_down_exps.bias"));
        assert_eq!((rows, cols, db), (e_n, h_n, down_bias));

        for (gguf, hf, n) in [
            ("ffn_gate_inp.weight", "mlp.router.weight", e_n * h_n),
            ("ffn_gate_inp.bias", "mlp.router.bias", e_n),
            ("attn_sinks.weight", "self_attn.sinks", 4),
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
                h_n,
            ),
            ("attn_q.bias", "self_attn.q_proj.bias", 64),
            ("attn_output.bias", "self_attn.o_proj.bias", h_n),
        ] {
            let (_, rows, cols, got) = presented(&ck, &format!("blk.{l}.{gguf}"));
            assert_eq!(rows * cols, n, "{gguf}");
            assert_eq!(got, p(hf).0, "{gguf}");
        }
        // llama.cpp names gpt-oss's FFN norm post_attention_norm, not ffn_norm.
        assert!(ck
            .tensor(&format!("blk.{l}.ffn_norm.weight"))
            .unwrap()
            .is_none());
    }
    let c = &ck.config;
    let moe = c.moe.unwrap();
    assert_eq!(
        (moe.experts, moe.used, moe.n_ff, moe.renorm),
        (4, 2, 32, true)
    );
    let y = c.yarn.expect("YaRN");
    assert_eq!(
        (
            y.factor,
            y.original_ctx,
            y.beta_fast,
            y.beta_slow,
            y.truncate
        ),
        (32.0, 64, 32.0, 1.0, true)
    );
    assert_eq!(
        c.layers.iter().map(|l| l.window).collect::<Vec<_>>(),
        [4, 0]
    );
    assert_eq!(c.layers[0].rope_base, 150000.0);
}

/// transformers' reading of an MXFP4 block row (convert_moe_packed_tensors):
/// element 2j is byte j's low nibble, 2j+1 its high one, times 2^(scale-127).
fn hf_dequant(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
    const FP4: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let mut out = Vec::new();
    for (b, &s) in blocks.chunks_exact(16).zip(scales) {
        let scale = 2f32.powi(s as i32 - 127);
        for &byte in b {
            out.push(FP4[(byte & 0xF) as usize] * scale);
            out.push(FP4[(byte >> 4) as usize] * scale);
        }
    }
    out
}

#[test]
fn gpt_oss_mxfp4_blocks_become_ggml_mxfp4_rows() {
    let (e_n, f_n, h_n) = (OSS_EXPERTS, OSS_FF, HIDDEN);
    let ck = HfCheckpoint::open(&tiny("gpt_oss_mxfp4")).unwrap();
    let float = HfCheckpoint::open(&tiny("gpt_oss")).unwrap();
    let bytes = stored("gpt_oss_mxfp4");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for l in 0..LAYERS {
        let raw = |leaf: &str| {
            let t = st
                .tensor(&format!("model.layers.{l}.mlp.experts.{leaf}"))
                .unwrap();
            assert_eq!(t.dtype(), safetensors::Dtype::U8);
            (t.data().to_vec(), t.shape().to_vec())
        };
        let (gu_blocks, shape) = raw("gate_up_proj_blocks");
        assert_eq!(shape, [e_n, 2 * f_n, h_n / 32, 16]);
        let (gu_scales, _) = raw("gate_up_proj_scales");
        let (dn_blocks, shape) = raw("down_proj_blocks");
        assert_eq!(shape, [e_n, h_n, f_n / 32, 16]);
        let (dn_scales, _) = raw("down_proj_scales");
        let gate_up = hf_dequant(&gu_blocks, &gu_scales); // [e][2f][h]
        let down = hf_dequant(&dn_blocks, &dn_scales); // [e][h][f]

        let (dt, rows, cols, gate) = presented(&ck, &format!("blk.{l}.ffn_gate_exps.weight"));
        assert_eq!((dt, rows, cols), (DType::MXFP4, e_n * f_n, h_n));
        let (_, _, _, up) = presented(&ck, &format!("blk.{l}.ffn_up_exps.weight"));
        let (dt, rows, cols, dn) = presented(&ck, &format!("blk.{l}.ffn_down_exps.weight"));
        assert_eq!((dt, rows, cols), (DType::MXFP4, e_n * h_n, f_n));
        for e in 0..e_n {
            for f in 0..f_n {
                let got = (e * f_n + f) * h_n;
                let even = (e * 2 * f_n + 2 * f) * h_n;
                assert_eq!(gate[got..got + h_n], gate_up[even..even + h_n]);
                assert_eq!(up[got..got + h_n], gate_up[even + h_n..even + 2 * h_n]);
            }
        }
        assert_eq!(dn, down);
        // The same matrices as gpt_oss's floats, within FP4's error: a wrong
        // orientation or row pick would be far off.
        for proj in ["gate", "up", "down"] {
            let name = format!("blk.{l}.ffn_{proj}_exps.weight");
            let (_, _, _, q) = presented(&ck, &name);
            let (_, _, _, w) = presented(&float, &name);
            let err: f32 = q.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
            let norm: f32 = w.iter().map(|b| b * b).sum();
            assert!(
                (err / norm).sqrt() < 0.2,
                "{name}: relative error {}",
                (err / norm).sqrt()
            );
        }
    }
}

/// A copy of the tiny `arch` with `edit` applied to (config text, safetensors bytes).
fn broken(arch: &str, edit: impl FnOnce(&mut String, &mut Vec<u8>)) -> String {
    let mut config = std::fs::read_to_string(tiny(arch).join("config.json")).unwrap();
    let mut weights = stored(arch);
    edit(&mut config, &mut weights);
    match HfCheckpoint::from_bytes(&config, vec![weights], arch) {
        Ok(_) => panic!("the broken {arch} opened"),
        Err(e) => e.to_string(),
    }
}

/// Renames a tensor in the header (same length: offsets stay valid).
fn rename(w: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let at = w
        .windows(from.len())
        .position(|x| x == from.as_bytes())
        .unwrap();
    w[at..at + to.len()].copy_from_slice(to.as_bytes());
}

#[test]
fn incomplete_or_inconsistent_experts_are_named() {
    let e = broken("qwen3moe", |_, w| {
        rename(
            w,
            "model.layers.1.mlp.experts.3.up_proj.weight",
            "model.layers.1.mlp.experts.3.up_proj.wexght",
        )
    });
    assert!(
        e.contains("blk.1.ffn_up_exps.weight") && e.contains("expert 3"),
        "{e}"
    );
    let e = broken("mixtral", |c, _| {
        *c = c.replace("\"num_local_experts\": 8", "\"num_local_experts\": 7")
    });
    assert!(e.contains("8 experts") && e.contains("declares 7"), "{e}");
    let e = broken("gpt_oss_mxfp4", |_, w| {
        rename(
            w,
            "model.layers.0.mlp.experts.down_proj_scales",
            "model.layers.0.mlp.experts.down_proj_scalez",
        )
    });
    assert!(e.contains("MXFP4") && e.contains("_scales"), "{e}");
}

/// Row `r` of a llama q/k weight after llama.cpp's rope permutation came
/// from this row of the checkpoint's.
fn unpermuted_row(r: usize, rows: usize, heads: usize) -> usize {
    let hd = rows / heads;
    let (h, i, j) = (r / hd, (r % hd) / 2, r % 2);
    h * hd + j * (hd / 2) + i
}

#[test]
fn convert_writes_experts_3d_with_llama_cpp_keys_and_reads_back() {
    use vkllm::model::gguf::{GgufFile, GgufValue};
    use vkllm::model::ModelConfig;
    for (dir, arch) in common::TINY_MOE_ARCHS {
        let hf = HfCheckpoint::open(&tiny(dir)).unwrap();
        let bytes = vkllm::model::convert::gguf_from_hf(&tiny(dir), None)
            .unwrap()
            .to_bytes()
            .unwrap();
        let g = GgufFile::from_bytes(bytes, &format!("{dir}.gguf")).unwrap();
        assert_eq!(g.architecture().unwrap(), arch);
        let moe = hf.config.moe.unwrap();
        assert_eq!(g.names().len(), hf.names().len(), "{dir}");
        for name in hf.names() {
            let want = hf.tensor(&name).unwrap().unwrap();
            let got = TensorSource::tensor(&g, &name)
                .unwrap()
                .unwrap_or_else(|| panic!("{dir}: no {name}"));
            assert_eq!(
                (got.dtype, got.rows, got.cols),
                (want.dtype, want.rows, want.cols),
                "{dir} {name}"
            );
            let info = g.tensor(&name).unwrap();
            if name.ends_with("_exps.weight") {
                let per = (want.rows / moe.experts) as u64;
                assert_eq!(
                    info.dims,
                    [want.cols as u64, per, moe.experts as u64],
                    "{dir} {name}"
                );
            }
            let llama_qk = arch == "llama"
                && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight"));
            if llama_qk {
                let heads = if name.ends_with("attn_q.weight") {
                    hf.config.n_head
                } else {
                    hf.config.n_head_kv
                };
                let rb = want.data.len() / want.rows;
                for r in 0..want.rows {
                    let from = unpermuted_row(r, want.rows, heads);
                    assert_eq!(
                        got.data[r * rb..(r + 1) * rb],
                        want.data[from * rb..(from + 1) * rb],
                        "{dir} {name} row {r}"
                    );
                }
            } else {
                assert!(got.data == want.data, "{dir} {name}: bytes differ");
            }
        }
        let p = arch;
        let u32_key = |k: &str| g.get_u64(&format!("{p}.{k}")).unwrap();
        assert_eq!(u32_key("expert_count"), Some(moe.experts as u64), "{dir}");
        assert_eq!(u32_key("expert_used_count"), Some(moe.used as u64), "{dir}");
        let expert_ff = u32_key("expert_feed_forward_length");
        assert_eq!(
            expert_ff,
            (arch != "llama").then_some(moe.n_ff as u64),
            "{dir}"
        );
        if arch == "gpt-oss" {
            assert!(
                matches!(g.get(&format!("{p}.rope.scaling.type")), Some(GgufValue::String(s)) if s == "yarn")
            );
            assert_eq!(
                g.get_f32(&format!("{p}.rope.scaling.factor")).unwrap(),
                Some(32.0)
            );
            assert_eq!(u32_key("rope.scaling.original_context_length"), Some(64));
            assert_eq!(u32_key("attention.sliding_window"), Some(4));
        }
        // Our GGUF reader makes the same configuration of it.
        let back = ModelConfig::from_gguf(&g, None).unwrap();
        assert_eq!(back.moe, hf.config.moe, "{dir}");
        assert_eq!(back.yarn, hf.config.yarn, "{dir}");
        assert_eq!(back.layers, hf.config.layers, "{dir}");
        assert_eq!(
            (back.n_ff, back.n_head, back.head_dim),
            (hf.config.n_ff, hf.config.n_head, hf.config.head_dim),
            "{dir}"
        );
    }
}

#[test]
fn quantized_convert_keeps_routers_f32_and_mxfp4_as_is() {
    use vkllm::model::gguf::GgufFile;
    for (dir, _) in common::TINY_MOE_ARCHS {
        let bytes = vkllm::model::convert::gguf_from_hf(&tiny(dir), Some(DType::Q8_0))
            .unwrap()
            .to_bytes()
            .unwrap();
        let g = GgufFile::from_bytes(bytes, &format!("{dir}.gguf")).unwrap();
        let ty = |n: &str| g.tensor(n).unwrap().dtype;
        assert_eq!(ty("blk.0.ffn_gate_inp.weight"), DType::F32, "{dir}");
        let experts = if dir == "gpt_oss_mxfp4" {
            DType::MXFP4
        } else {
            DType::Q8_0
        };
        for p in ["gate", "up", "down"] {
            let t = g.tensor(&format!("blk.1.ffn_{p}_exps.weight")).unwrap();
            assert_eq!((t.dtype, t.dims.len()), (experts, 3), "{dir} {p}");
        }
    }
}
