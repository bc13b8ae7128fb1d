//! Compiles every `glsl/*.comp` to SPIR-V with `glslc` and generates
//! `$OUT_DIR/shaders.rs`, a table of `(name, spirv bytes)` embedded with
//! `include_bytes!`.
//!
//! A shader that includes `dequant.glsl` reads weights, so it is compiled once
//! per weight dtype with `-DTYPE_<DTYPE>` and named `<stem>.<dtype>`; every
//! other shader is compiled once and named `<stem>`. A shader whose source
//! contains `#extension GL_KHR_cooperative_matrix` or
//! `#extension GL_EXT_integer_dot_product` is built only when the compiler
//! supports that extension (probed here; the result is exported as the cfgs
//! `vkllm_glsl_coopmat` / `vkllm_glsl_int_dot` and as consts in shaders.rs).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Weight dtypes, as `DType::name()` spells them.
const DTYPES: [&str; 11] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
];

const TARGET_ENV: &str = "--target-env=vulkan1.2";

fn main() {
    let glsl_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("glsl");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed={}", glsl_dir.display());
    println!("cargo:rerun-if-env-changed=GLSLC");
    println!("cargo:rustc-check-cfg=cfg(vkllm_glsl_coopmat)");
    println!("cargo:rustc-check-cfg=cfg(vkllm_glsl_int_dot)");

    let glslc = find_glslc();
    let coopmat = probe(&glslc, &out_dir, "GL_KHR_cooperative_matrix");
    let int_dot = probe(&glslc, &out_dir, "GL_EXT_integer_dot_product");
    if coopmat {
        println!("cargo:rustc-cfg=vkllm_glsl_coopmat");
    }
    if int_dot {
        println!("cargo:rustc-cfg=vkllm_glsl_int_dot");
    }

    let mut entries = Vec::new();
    let mut sources: Vec<PathBuf> = fs::read_dir(&glsl_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", glsl_dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    sources.sort();
    for path in &sources {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    for path in sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "comp"))
    {
        let src = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if (src.contains("#extension GL_KHR_cooperative_matrix") && !coopmat)
            || (src.contains("#extension GL_EXT_integer_dot_product") && !int_dot)
        {
            println!(
                "cargo:warning={} skipped: glslc lacks an extension it needs",
                path.display()
            );
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if src.contains("#include \"dequant.glsl\"") {
            for dt in DTYPES {
                let name = format!("{stem}.{dt}");
                let define = format!("-DTYPE_{}", dt.to_ascii_uppercase());
                let spv = out_dir.join(format!("{name}.spv"));
                compile(&glslc, path, &glsl_dir, &spv, &[&define]);
                entries.push((name, spv));
            }
        } else {
            let spv = out_dir.join(format!("{stem}.spv"));
            compile(&glslc, path, &glsl_dir, &spv, &[]);
            entries.push((stem, spv));
        }
    }

    let mut rs = String::new();
    writeln!(rs, "/// Whether glslc supports GL_KHR_cooperative_matrix.").unwrap();
    writeln!(rs, "pub const GLSLC_COOPMAT: bool = {coopmat};").unwrap();
    writeln!(rs, "/// Whether glslc supports GL_EXT_integer_dot_product.").unwrap();
    writeln!(rs, "pub const GLSLC_INT_DOT: bool = {int_dot};").unwrap();
    writeln!(rs, "/// `(name, SPIR-V bytes)` of every compiled shader.").unwrap();
    writeln!(rs, "pub const SHADERS: &[(&str, &[u8])] = &[").unwrap();
    for (name, spv) in &entries {
        writeln!(
            rs,
            "    ({name:?}, include_bytes!({:?})),",
            spv.display().to_string()
        )
        .unwrap();
    }
    writeln!(rs, "];").unwrap();
    fs::write(out_dir.join("shaders.rs"), rs).unwrap();
}

fn find_glslc() -> PathBuf {
    let candidate = env::var_os("GLSLC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("glslc"));
    match Command::new(&candidate).arg("--version").output() {
        Ok(o) if o.status.success() => candidate,
        _ => panic!(
            "\n\nvkllm needs the GLSL compiler `glslc` to build its Vulkan shaders, \
             and `{}` could not be run.\nInstall it with `apt-get install glslc` \
             (Debian/Ubuntu) or the Vulkan SDK (https://vulkan.lunarg.com), or point \
             the GLSLC environment variable at it.\n",
            candidate.display()
        ),
    }
}

/// Whether `glslc` accepts `#extension <ext> : require` in a compute shader.
fn probe(glslc: &Path, out_dir: &Path, ext: &str) -> bool {
    let src = out_dir.join(format!("probe_{ext}.comp"));
    let body = format!(
        "#version 450\n#extension {ext} : require\nlayout(local_size_x = 1) in;\nvoid main() {{}}\n"
    );
    if fs::write(&src, body).is_err() {
        return false;
    }
    Command::new(glslc)
        .args([TARGET_ENV, "-o"])
        .arg(out_dir.join(format!("probe_{ext}.spv")))
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn compile(glslc: &Path, src: &Path, include: &Path, out: &Path, defines: &[&str]) {
    let output = Command::new(glslc)
        .args([TARGET_ENV, "-O", "-fshader-stage=compute", "-I"])
        .arg(include)
        .args(defines)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run glslc: {e}"));
    if !output.status.success() {
        panic!(
            "\n\nglslc failed on {} {}:\n{}{}\n",
            src.display(),
            defines.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
