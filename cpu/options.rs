//! How the CPU backend picks its kernels, from the caller or the
//! environment: its `VKLLM_*` settings are parsed here, once.

use super::simd::Isa;
use crate::error::Result;
use crate::settings::choice;

/// Kernel settings of [`super::CpuBackend::with_options`]; the default is
/// the best instruction set this CPU has, with repacked weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuKernelOptions {
    /// `VKLLM_CPU_ISA=amx|avx512|avx2|neon|scalar`: the instruction set
    /// whose kernels run (so an AVX-512 machine can time its AVX2 kernels;
    /// AVX2 also means no VNNI; `avx512` on AMX, the VNNI prefill tiles).
    /// `None`: the best this CPU has.
    pub isa: Option<Isa>,
    /// `VKLLM_CPU_REPACK=on|off`: whether weights of the types
    /// `repack::packs` names are repacked at upload for the decode kernels;
    /// off keeps GGUF rows (to time the row kernels).
    pub repack: bool,
    /// `VKLLM_CPU_ROOM=on|off`: whether helper threads park while the
    /// machine has no core for them (another process busy on the cores;
    /// `cpu/room.rs`), and come back when cores idle; off keeps every
    /// thread working whatever the load.
    pub room: bool,
}

impl Default for CpuKernelOptions {
    fn default() -> Self {
        CpuKernelOptions {
            isa: None,
            repack: true,
            room: true,
        }
    }
}

impl CpuKernelOptions {
    /// The options the environment gives: an error names a variable set to
    /// a value it does not take. An instruction set this CPU lacks is not
    /// one: it falls back to the best with a warning, so one script can
    /// name it on every machine.
    pub fn from_env() -> Result<Self> {
        let words = Isa::ALL.map(|i| (i.setting_name(), i));
        let isa = match choice("VKLLM_CPU_ISA", &words)? {
            Some(isa) if !isa.available() => {
                eprintln!(
                    "warning: VKLLM_CPU_ISA={} is not an instruction set this CPU has; using \
                     the best one",
                    isa.setting_name()
                );
                None
            }
            isa => isa,
        };
        Ok(CpuKernelOptions {
            isa,
            repack: choice("VKLLM_CPU_REPACK", &crate::settings::ON_OFF)?.unwrap_or(true),
            room: choice("VKLLM_CPU_ROOM", &crate::settings::ON_OFF)?.unwrap_or(true),
        })
    }
}
