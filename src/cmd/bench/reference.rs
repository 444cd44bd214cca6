//! The PyTorch reference of `--compare`: `bench/torch_reference.py` run as a subprocess with
//! the same config and shapes, its JSON read back into [`ModeTiming`]s.
//!
//! Interpreter: `$SPECC_PYTHON`, else `python3`. Script: `$SPECC_TORCH_REFERENCE`, else
//! `bench/torch_reference.py` under the working directory, else under this source tree.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use specc_models::Method;

use super::figures::{Figure, Kind};
use super::table::ModeTiming;

pub const SCRIPT: &str = "bench/torch_reference.py";
pub const DEFAULT_MODES: &str = "eager,graph,compile";
/// Modes `bench/torch_reference.py` knows (checked before anything is measured).
pub const MODES: [&str; 4] = ["eager", "graph", "compile", "compile-layers"];

/// Checks a `--torch-modes` list.
pub fn parse_modes(list: &str) -> Result<Vec<String>> {
    let modes: Vec<String> = list
        .split(',')
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    if modes.is_empty() || modes.iter().any(|m| !MODES.contains(&m.as_str())) {
        bail!(
            "--torch-modes {list}: expected a comma-separated subset of {}",
            MODES.join(",")
        );
    }
    Ok(modes)
}

/// The reference's `--figure` argument for a specc figure, or why there is none.
pub fn figure_arg(f: &Figure, method: Option<Method>) -> Result<String, String> {
    match f.kind {
        Kind::Decode => Ok(format!("forward,{},{},1", f.batch, f.context)),
        Kind::Verify(t) => Ok(format!("forward,{},{},{t}", f.batch, f.context)),
        Kind::Spec => match method {
            Some(Method::DraftModel) => Ok(format!("spec,{},{}", f.batch, f.context)),
            Some(m) => Err(format!(
                "no PyTorch reference for method {} (only draft_model is modelled)",
                m.name()
            )),
            None => Err("no speculative method given".into()),
        },
    }
}

/// What to ask the reference for.
pub struct Request<'a> {
    /// The target's config.json.
    pub config: PathBuf,
    /// The draft's config (a directory or config.json) for a draft_model spec step.
    pub draft: Option<PathBuf>,
    pub k: usize,
    /// `--figure` arguments, one per figure that has a reference.
    pub figures: Vec<String>,
    pub modes: &'a [String],
    pub iters: usize,
}

/// Arguments after the script path.
pub fn args(r: &Request) -> Vec<String> {
    let mut a = vec![
        "--config".to_string(),
        r.config.display().to_string(),
        "--modes".into(),
        r.modes.join(","),
        "--iters".into(),
        r.iters.to_string(),
        "--warmup".into(),
        "10".into(),
    ];
    if let Some(d) = &r.draft {
        a.extend(["--draft".into(), d.display().to_string()]);
        a.extend(["--k".into(), r.k.to_string()]);
    }
    for f in &r.figures {
        a.extend(["--figure".into(), f.clone()]);
    }
    a
}

pub fn python() -> String {
    std::env::var("SPECC_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The script, or an error naming every place looked at.
pub fn script() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SPECC_TORCH_REFERENCE") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("SPECC_TORCH_REFERENCE={}: no such file", p.display());
        }
        return Ok(p);
    }
    let here = PathBuf::from(SCRIPT);
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join(SCRIPT);
    if here.is_file() {
        return Ok(here);
    }
    if built.is_file() {
        return Ok(built);
    }
    bail!(
        "the PyTorch reference script was not found at {} or {} (set SPECC_TORCH_REFERENCE)",
        here.display(),
        built.display()
    )
}

/// The reference's answer: versions and, per requested figure, its modes.
pub struct Output {
    pub torch: String,
    pub device: String,
    pub figures: Vec<Vec<ModeTiming>>,
    pub json: Value,
}

/// Reads the script's stdout: one JSON object with a `figures` array in request order.
pub fn parse(stdout: &str, expected: usize) -> Result<Output> {
    let json: Value = serde_json::from_str(stdout.trim())
        .map_err(|e| anyhow!("the PyTorch reference printed no JSON object: {e}"))?;
    let figs = json["figures"]
        .as_array()
        .ok_or_else(|| anyhow!("the PyTorch reference's JSON has no \"figures\" array"))?;
    if figs.len() != expected {
        bail!(
            "the PyTorch reference returned {} figures for {expected} asked",
            figs.len()
        );
    }
    let mut figures = Vec::new();
    for f in figs {
        let modes = f["modes"]
            .as_object()
            .ok_or_else(|| anyhow!("a reference figure has no \"modes\" object"))?;
        figures.push(
            modes
                .iter()
                .map(|(mode, m)| ModeTiming {
                    mode: mode.clone(),
                    result: match (m["median_ms"].as_f64(), m["skipped"].as_str()) {
                        (Some(ms), _) => Ok(ms),
                        (None, Some(why)) => Err(why.to_string()),
                        (None, None) => Err("no median_ms in the reference's output".into()),
                    },
                })
                .collect(),
        );
    }
    let text = |k: &str| json[k].as_str().unwrap_or("?").to_string();
    Ok(Output {
        torch: text("torch"),
        device: text("device"),
        figures,
        json,
    })
}

/// Runs `python script args`, passing its progress (stderr) through, and parses its JSON.
/// Errors name what is missing: the interpreter, torch in it, or the script.
pub fn run(python: &str, script: &Path, args: &[String]) -> Result<Output> {
    let mut child = Command::new(python)
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow!(
                "PyTorch reference: python interpreter `{python}` not found (set SPECC_PYTHON to one with torch installed)"
            ),
            _ => anyhow!("PyTorch reference: cannot start `{python}`: {e}"),
        })?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let relay = std::thread::spawn(move || {
        let mut last = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if !line.trim().is_empty() {
                last.push(line);
            }
        }
        last
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut out)
        .context("reading the PyTorch reference's output")?;
    let status = child.wait().context("waiting for the PyTorch reference")?;
    let lines = relay.join().unwrap_or_default();
    let last = lines.last().cloned().unwrap_or_default();
    let last = last.strip_prefix("error: ").unwrap_or(&last);
    match status.code() {
        Some(0) => {
            let expected = args.iter().filter(|a| *a == "--figure").count();
            parse(&out, expected)
        }
        // The script's own exit statuses: 3 = torch missing or no CUDA device, 2 = usage.
        Some(3) => bail!("PyTorch reference ({python}): {last}"),
        Some(2) => bail!("PyTorch reference rejected its arguments: {last}"),
        code => bail!(
            "PyTorch reference `{python} {}` failed ({}): {last}",
            script.display(),
            code.map_or("killed by a signal".into(), |c| format!("exit status {c}"))
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::bench::figures::{plan, Request as Plan};

    fn suite() -> Vec<Figure> {
        plan(&Plan {
            batch: 1,
            context: 1024,
            tokens: None,
            spec: true,
            compare: true,
            suite: true,
        })
    }

    #[test]
    fn figure_arguments() {
        let f = suite();
        let args: Vec<Result<String, String>> = f
            .iter()
            .map(|f| figure_arg(f, Some(Method::DraftModel)))
            .collect();
        assert_eq!(
            args,
            [
                Ok("forward,1,1024,1".to_string()),
                Ok("forward,1,1024,8".into()),
                Ok("forward,8,1024,1".into()),
                Ok("forward,1,8192,1".into()),
                Ok("spec,1,1024".into()),
            ]
        );
        let eagle = figure_arg(&f[4], Some(Method::Eagle3)).unwrap_err();
        assert!(eagle.contains("method eagle3"), "{eagle}");
    }

    #[test]
    fn modes_are_checked() {
        assert_eq!(parse_modes("eager,compile-layers").unwrap().len(), 2);
        let e = parse_modes("eager,fast").unwrap_err().to_string();
        assert!(e.contains("--torch-modes eager,fast"), "{e}");
        assert!(parse_modes(",").is_err());
    }

    #[test]
    fn output_is_read_in_request_order() {
        let out = r#"{"torch": "2.11.0", "device": "NVIDIA H200", "figures": [
            {"modes": {"eager": {"median_ms": 30.5}, "compile": {"skipped": "no inductor"}}},
            {"modes": {"eager": {"median_ms": 2.0}, "compile": {"median_ms": 1.0}}}]}"#;
        let o = parse(out, 2).unwrap();
        assert_eq!(o.device, "NVIDIA H200");
        let mode = |f: usize, m: &str| {
            o.figures[f]
                .iter()
                .find(|t| t.mode == m)
                .map(|t| t.result.clone())
        };
        assert_eq!(mode(0, "eager"), Some(Ok(30.5)));
        assert_eq!(mode(0, "compile"), Some(Err("no inductor".to_string())));
        assert_eq!(mode(1, "compile"), Some(Ok(1.0)));
        assert!(parse(out, 3).is_err());
        assert!(parse("Traceback ...", 1).is_err());
    }

    #[test]
    fn missing_interpreter_is_named() {
        let e = run("/nonexistent/python3", Path::new(SCRIPT), &[])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("python interpreter `/nonexistent/python3` not found"),
            "{e}"
        );
    }

    /// An interpreter without torch: the error names it and says torch is what is missing.
    /// (`python3 -S` has no site-packages.) Skipped when no python3 is on PATH.
    #[test]
    fn missing_torch_is_named() {
        if Command::new("python3").arg("-c").arg("0").output().is_err() {
            eprintln!("skipped: python3 not runnable");
            return;
        }
        let dir = std::env::temp_dir().join(format!("specc-no-torch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let py = dir.join("python-without-site");
        std::fs::write(&py, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let config = root.join("bench/configs/llama-3.1-8b/config.json");
        let args: Vec<String> = ["--config", config.to_str().unwrap(), "--device", "cpu"]
            .map(String::from)
            .to_vec();
        let e = run(py.to_str().unwrap(), &root.join(SCRIPT), &args)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("python-without-site"), "{e}");
        assert!(e.contains("torch is not importable"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A real run of the script (CPU, tiny shapes) reads back: figures in order, the CUDA-only
    /// mode skipped with its reason. Skipped when python3 has no importable torch.
    #[test]
    fn cpu_run_reads_back() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let modes = parse_modes("eager,graph").unwrap();
        let r = Request {
            config: root.join("bench/configs/llama-3.1-8b/config.json"),
            draft: Some(root.join("bench/configs/llama-3.2-1b")),
            k: 2,
            figures: vec!["forward,2,8,1".into(), "spec,1,8".into()],
            modes: &modes,
            iters: 3,
        };
        let mut a = args(&r);
        a.extend(["--device", "cpu", "--tiny"].map(String::from));
        let out = match run("python3", &root.join(SCRIPT), &a) {
            Ok(o) => o,
            Err(e)
                if e.to_string().contains("not importable")
                    || e.to_string().contains("not found") =>
            {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(out.device, "cpu");
        assert_eq!(out.figures.len(), 2);
        for f in &out.figures {
            let eager = f.iter().find(|m| m.mode == "eager").unwrap();
            assert!(eager.result.as_ref().is_ok_and(|&ms| ms > 0.0), "{eager:?}");
            let graph = f.iter().find(|m| m.mode == "graph").unwrap();
            assert!(
                graph.result.as_ref().is_err_and(|w| w.contains("CUDA")),
                "{graph:?}"
            );
        }
    }

    /// The arguments specc builds are ones the script accepts (its `--dry-run` needs no
    /// torch); skipped when no python3 is on PATH.
    #[test]
    fn script_accepts_the_arguments() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let figures: Vec<String> = suite()
            .iter()
            .filter_map(|f| figure_arg(f, Some(Method::DraftModel)).ok())
            .collect();
        let modes = parse_modes(DEFAULT_MODES).unwrap();
        let r = Request {
            config: root.join("bench/configs/llama-3.1-8b/config.json"),
            draft: Some(root.join("bench/configs/llama-3.2-1b")),
            k: 7,
            figures,
            modes: &modes,
            iters: 60,
        };
        let mut a = args(&r);
        a.push("--dry-run".into());
        let out = match Command::new("python3")
            .arg(root.join(SCRIPT))
            .args(&a)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("skipped: python3 not runnable: {e}");
                return;
            }
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let labels: Vec<&str> = v["figures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["label"].as_str().unwrap())
            .collect();
        assert_eq!(
            labels,
            [
                "forward T=1 B=1 ctx=1024",
                "forward T=8 B=1 ctx=1024",
                "forward T=1 B=8 ctx=1024",
                "forward T=1 B=1 ctx=8192",
                "spec k=7 B=1 ctx=1024"
            ]
        );
        assert_eq!(v["iters"], 60);
    }
}
