//! Per-op wall time of the interpreter, for finding where a CPU step goes: with
//! `SPECC_CPU_PROFILE=1` in the environment every executed node adds its time to its op's
//! row (and to its leading dim: the rows of a matmul), and [`report`] prints the table.
//! Off, the cost is one cached flag read per node.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The environment variable that turns the profile on.
pub const PROFILE_VAR: &str = "SPECC_CPU_PROFILE";

/// Whether `SPECC_CPU_PROFILE=1` (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(PROFILE_VAR).is_ok_and(|v| v == "1"))
}

/// `(op, rows)` → (calls, total time).
type Table = HashMap<(&'static str, usize), (u64, Duration)>;

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Adds one execution of `op` over `rows` leading rows taking `t`.
pub(crate) fn record(op: &'static str, rows: usize, t: Duration) {
    let mut tab = table().lock().unwrap_or_else(|e| e.into_inner());
    let e = tab.entry((op, rows)).or_default();
    e.0 += 1;
    e.1 += t;
}

/// The profile so far as a table (op, rows, calls, total ms, µs a call, share), slowest
/// first; `None` when the profile is off or empty.
pub fn report() -> Option<String> {
    if !enabled() {
        return None;
    }
    let tab = table().lock().unwrap_or_else(|e| e.into_inner());
    if tab.is_empty() {
        return None;
    }
    let total: Duration = tab.values().map(|v| v.1).sum();
    let mut rows: Vec<_> = tab.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
    let mut out = format!(
        "interpreter profile ({PROFILE_VAR}=1): {:.1} ms in {} ops\n{:<22} {:>6} {:>8} {:>10} {:>9} {:>6}\n",
        total.as_secs_f64() * 1e3,
        tab.values().map(|v| v.0).sum::<u64>(),
        "op",
        "rows",
        "calls",
        "total ms",
        "µs/call",
        "%"
    );
    for ((op, r), (n, t)) in rows {
        out.push_str(&format!(
            "{op:<22} {r:>6} {n:>8} {:>10.2} {:>9.2} {:>6.1}\n",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e6 / *n as f64,
            100.0 * t.as_secs_f64() / total.as_secs_f64()
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_accumulate_per_op_and_rows() {
        record("probe_op", 3, Duration::from_micros(10));
        record("probe_op", 3, Duration::from_micros(30));
        let tab = table().lock().unwrap();
        let (n, t) = tab[&("probe_op", 3)];
        assert_eq!(n, 2);
        assert_eq!(t, Duration::from_micros(40));
    }
}
