//! NVRTC: CUDA C++ source → cubin for one architecture, with an on-disk cache.
//!
//! The only module that talks to NVRTC. It loads `libnvrtc` dynamically through cudarc
//! (checked first: cudarc panics when the library is missing), compiles with
//! `--gpu-architecture=<arch> -std=c++17 --include-path=<cuda include> -Xptxas=-v`, returns
//! the cubin with the register/spill figures parsed from the ptxas log, and caches results
//! under `$SPECC_CACHE_DIR` (default `~/.cache/specc/kernels`) keyed by
//! sha256(source, arch, NVRTC version, options).
//!
//! Headers: NVRTC has no built-in `cuda_bf16.h`; the include directory is
//! `$SPECC_CUDA_INCLUDE`, else `$CUDA_HOME/include`, else `/usr/local/cuda/include`
//! (`scripts/nvrtc-env.sh` sets the first for the pip-installed toolkit).

use crate::abi::KernelSource;
use crate::error::{number_lines, CompileFailure, Error};
use crate::module::{group_modules, ModuleSource};
use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use specc_ir::engine::Arch;

/// Resource figures from the `-Xptxas=-v` log (summed / maxed over the module's entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtxasStats {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    pub smem_bytes: u32,
}

impl PtxasStats {
    /// Parses lines such as `Used 40 registers, used 1 barriers, 8192 bytes smem` and
    /// `0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads`.
    pub fn parse(log: &str) -> PtxasStats {
        let mut s = PtxasStats::default();
        for line in log.lines() {
            let words: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                .filter(|w| !w.is_empty())
                .collect();
            for (i, w) in words.iter().enumerate() {
                let num = |j: usize| {
                    words
                        .get(j)
                        .and_then(|x| x.parse::<u32>().ok())
                        .unwrap_or(0)
                };
                let next = |k: usize| words.get(i + k).copied().unwrap_or("");
                match *w {
                    "registers" if i >= 1 => s.registers = s.registers.max(num(i - 1)),
                    "bytes" if i >= 1 => match (next(1), next(2)) {
                        ("stack", "frame") => s.stack_bytes = s.stack_bytes.max(num(i - 1)),
                        ("spill", "stores") => s.spill_stores += num(i - 1),
                        ("spill", "loads") => s.spill_loads += num(i - 1),
                        ("smem", _) => s.smem_bytes = s.smem_bytes.max(num(i - 1)),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        s
    }

    /// The figures of one entry of a module's log: the lines from `Compiling entry function
    /// '<entry>'` to the next entry's. Empty figures when the log has no such entry.
    pub fn parse_entry(log: &str, entry: &str) -> PtxasStats {
        const START: &str = "Compiling entry function '";
        let mut section = String::new();
        let mut inside = false;
        for line in log.lines() {
            if let Some(at) = line.find(START) {
                inside = line[at + START.len()..].starts_with(&format!("{entry}'"));
            }
            if inside {
                section.push_str(line);
                section.push('\n');
            }
        }
        PtxasStats::parse(&section)
    }
}

/// A compiled module.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub arch: Arch,
    /// The NVRTC program log (ptxas output included).
    pub log: String,
    pub stats: PtxasStats,
    /// Whether it came from the on-disk cache.
    pub cached: bool,
    /// Time spent, compile or cache read.
    pub elapsed: Duration,
}

/// A compiled module of [`Nvrtc::compile_many`]: one cubin holding several kernels.
#[derive(Clone, Debug)]
pub struct CompiledModule {
    /// [`ModuleSource::name`]: the kernel's own name for a module of one kernel.
    pub name: String,
    /// The kernels (entry symbols) the cubin holds.
    pub entries: Vec<String>,
    pub compiled: Compiled,
}

/// A handle on the loaded NVRTC library and its configuration.
#[derive(Clone, Debug)]
pub struct Nvrtc {
    include_dir: PathBuf,
    version: (i32, i32),
    cache_dir: Option<PathBuf>,
}

/// Destroys an NVRTC program on every exit path.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful `nvrtcCreateProgram` and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn check(status: sys::nvrtcResult, call: &'static str) -> Result<(), Error> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            call,
            status: format!("{status:?}"),
        })
    }
}

fn include_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SPECC_CUDA_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(PathBuf::from(d).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs
}

fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SPECC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/specc/kernels"))
}

impl Nvrtc {
    /// For tests: NVRTC without a disk cache, or `None` after recording why it is unusable
    /// here (`specc_ir::testing::skip`); with `SPECC_REQUIRE_NVRTC=1` an unusable NVRTC is a
    /// panic instead (CI, where a silent skip would hide every compile test).
    pub fn or_skip() -> Option<Nvrtc> {
        match Nvrtc::new() {
            Ok(n) => Some(n.with_cache_dir(None)),
            Err(e @ (Error::NvrtcUnavailable { .. } | Error::HeadersNotFound { .. })) => {
                if std::env::var("SPECC_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                    panic!("SPECC_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}");
                }
                specc_ir::testing::skip(format!("{e} (source scripts/nvrtc-env.sh to enable)"));
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Loads NVRTC and finds the CUDA headers; the cache directory defaults as documented.
    pub fn new() -> Result<Nvrtc, Error> {
        // SAFETY: loading a shared library runs its initialisers; libnvrtc's are benign.
        // This only probes the candidate names and drops the handles.
        let present = unsafe { sys::is_culib_present() };
        if !present {
            return Err(Error::NvrtcUnavailable {
                reason:
                    "libnvrtc could not be loaded (set LD_LIBRARY_PATH, see scripts/nvrtc-env.sh)"
                        .into(),
            });
        }
        let searched = include_candidates();
        let include_dir = searched
            .iter()
            .find(|d| d.join("cuda_bf16.h").is_file())
            .cloned()
            .ok_or(Error::HeadersNotFound { searched })?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above); both out-pointers are valid.
        check(
            unsafe { sys::nvrtcVersion(&mut major, &mut minor) },
            "nvrtcVersion",
        )?;
        Ok(Nvrtc {
            include_dir,
            version: (major, minor),
            cache_dir: default_cache_dir(),
        })
    }

    /// Uses `dir` for the cache, or no cache with `None`.
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Nvrtc {
        self.cache_dir = dir;
        self
    }

    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    pub fn include_dir(&self) -> &Path {
        &self.include_dir
    }

    /// The exact option list passed to `nvrtcCompileProgram`.
    pub fn options(&self, arch: Arch) -> Vec<String> {
        vec![
            format!("--gpu-architecture={}", arch.name()),
            "-std=c++17".into(),
            format!("--include-path={}", self.include_dir.display()),
            "-Xptxas=-v".into(),
        ]
    }

    /// The cache key of `source` compiled for `arch` by this NVRTC with these options.
    pub fn cache_key(&self, source: &str, arch: Arch) -> String {
        let mut h = Sha256::new();
        for part in [
            source.to_string(),
            arch.name().to_string(),
            format!("nvrtc {}.{}", self.version.0, self.version.1),
        ]
        .into_iter()
        .chain(self.options(arch))
        {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Compiles a generated kernel module.
    pub fn compile(&self, kernel: &KernelSource, arch: Arch) -> Result<Compiled, Error> {
        self.compile_source(&kernel.name, &kernel.source, arch)
    }

    /// Compiles the distinct kernels of `kernels` (by name; the first of each name) for each
    /// of `archs` on `threads` worker threads pulling from one queue. Kernels are grouped
    /// into modules first ([`group_modules`]: kernels sharing a prelude become one NVRTC
    /// program, at most `threads` per prelude), since each program pays the prelude parse.
    /// Results come back in (module, arch) order, costliest module first.
    pub fn compile_many(
        &self,
        kernels: &[&KernelSource],
        archs: &[Arch],
        threads: usize,
    ) -> Result<Vec<CompiledModule>, Error> {
        let modules = group_modules(kernels, threads);
        let jobs: Vec<(&ModuleSource, Arch)> = modules
            .iter()
            .flat_map(|m| archs.iter().map(move |&a| (m, a)))
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
        std::thread::scope(|sc| {
            for _ in 0..threads.clamp(1, jobs.len().max(1)) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(m, arch)) = jobs.get(i) else { break };
                    let r = self.compile_source(&m.name, &m.source, arch);
                    let failed = r.is_err();
                    results.lock().expect("no worker panics").push((i, r));
                    if failed {
                        // Let the other workers drain: skip the rest of the queue.
                        next.store(jobs.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        let mut results = results.into_inner().expect("no worker panics");
        results.sort_by_key(|(i, _)| *i);
        results
            .into_iter()
            .map(|(i, r)| {
                r.map(|compiled| CompiledModule {
                    name: jobs[i].0.name.clone(),
                    entries: jobs[i].0.entries.clone(),
                    compiled,
                })
            })
            .collect()
    }

    /// Compiles any CUDA C++ module; `name` names the program in logs.
    pub fn compile_source(&self, name: &str, source: &str, arch: Arch) -> Result<Compiled, Error> {
        let start = Instant::now();
        let key = self.cache_key(source, arch);
        if let Some(dir) = &self.cache_dir {
            let cubin_path = dir.join(format!("{key}.cubin"));
            if let Ok(cubin) = std::fs::read(&cubin_path) {
                let log =
                    std::fs::read_to_string(dir.join(format!("{key}.log"))).unwrap_or_default();
                return Ok(Compiled {
                    cubin,
                    arch,
                    stats: PtxasStats::parse(&log),
                    log,
                    cached: true,
                    elapsed: start.elapsed(),
                });
            }
        }
        let (cubin, log) = self.compile_uncached(name, source, arch)?;
        if let Some(dir) = &self.cache_dir {
            write_atomic(dir, &format!("{key}.log"), log.as_bytes())?;
            write_atomic(dir, &format!("{key}.cubin"), &cubin)?;
        }
        Ok(Compiled {
            cubin,
            arch,
            stats: PtxasStats::parse(&log),
            log,
            cached: false,
            elapsed: start.elapsed(),
        })
    }

    fn compile_uncached(
        &self,
        name: &str,
        source: &str,
        arch: Arch,
    ) -> Result<(Vec<u8>, String), Error> {
        let compile_err = |status: String, log: String| {
            Error::Compile(Box::new(CompileFailure {
                name: name.to_string(),
                arch: arch.name().to_string(),
                status,
                log,
                numbered_source: number_lines(source),
            }))
        };
        let src = CString::new(source)
            .map_err(|_| compile_err("source contains NUL".into(), String::new()))?;
        let prog_name = CString::new(format!("{name}.cu"))
            .map_err(|_| compile_err("name contains NUL".into(), String::new()))?;
        let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: `src` and `prog_name` are NUL-terminated and outlive the call; no headers
        // are passed (count 0, null arrays); `raw` is a valid out-pointer.
        check(
            unsafe {
                sys::nvrtcCreateProgram(
                    &mut raw,
                    src.as_ptr(),
                    prog_name.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            },
            "nvrtcCreateProgram",
        )?;
        let prog = Program(raw);
        let opts: Vec<CString> = self
            .options(arch)
            .into_iter()
            .map(|o| {
                CString::new(o)
                    .map_err(|_| compile_err("option contains NUL".into(), String::new()))
            })
            .collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is a live program; `opt_ptrs` holds `opts.len()` pointers to
        // NUL-terminated strings that outlive the call.
        let status =
            unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
        let log = program_log(&prog)?;
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(compile_err(format!("{status:?}"), log));
        }
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
        check(
            unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) },
            "nvrtcGetCUBINSize",
        )?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has exactly the `size` bytes NVRTC reported.
        check(
            unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) },
            "nvrtcGetCUBIN",
        )?;
        Ok((cubin, log))
    }
}

fn program_log(prog: &Program) -> Result<String, Error> {
    let mut size = 0usize;
    // SAFETY: `prog` is a live program; `size` is a valid out-pointer.
    check(
        unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) },
        "nvrtcGetProgramLogSize",
    )?;
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` holds the `size` bytes (NUL included) NVRTC reported.
    check(
        unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast::<c_char>()) },
        "nvrtcGetProgramLog",
    )?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Writes `dir/name` through a unique temporary file and a rename, so concurrent
/// compilers never see a partial file.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Error> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Cache { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    let dst = dir.join(name);
    std::fs::rename(&tmp, &dst).map_err(io(&dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(a.name().parse::<Arch>().unwrap(), a);
        }
        assert!(matches!(
            "sm_80".parse::<Arch>(),
            Err(specc_ir::engine::UnknownArch(_))
        ));
    }

    #[test]
    fn parses_ptxas_log() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Function properties for k\n    \
                   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 72 registers, used 1 barriers, 9216 bytes smem, 400 bytes cmem[0]\n";
        let s = PtxasStats::parse(log);
        assert_eq!(
            s,
            PtxasStats {
                registers: 72,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8,
                smem_bytes: 9216
            }
        );
    }

    #[test]
    fn parses_one_entry_of_a_module_log() {
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90a'\n\
                   ptxas info    : Function properties for a\n    \
                   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 10 registers, 380 bytes cmem[0]\n\
                   ptxas info    : Compiling entry function 'ab' for 'sm_90a'\n\
                   ptxas info    : Function properties for ab\n    \
                   16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
                   ptxas info    : Used 200 registers, 1024 bytes smem, 380 bytes cmem[0]\n";
        assert_eq!(PtxasStats::parse_entry(log, "a").registers, 10);
        let ab = PtxasStats::parse_entry(log, "ab");
        assert_eq!(
            (ab.registers, ab.spill_stores, ab.smem_bytes),
            (200, 8, 1024)
        );
        assert_eq!(PtxasStats::parse_entry(log, "c"), PtxasStats::default());
    }
}
