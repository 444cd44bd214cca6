//! Which figures a `specc bench` call measures, and how they share GPU sessions.
//!
//! A figure is one timed graph: the decode step, a target forward over T tokens (the verify of
//! T tokens), or the speculative step of `--spec`, at one batch and context. Figures with the
//! same batch, context and session kind are measured on one session (weights uploaded and
//! kernels loaded once): decode and verify of the same shape share the plain decode session.

/// What is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One plain decode step (T = 1).
    Decode,
    /// One target forward over this many tokens per sequence.
    Verify(usize),
    /// One whole speculative step of `--spec`.
    Spec,
}

/// The session a figure runs on: plain decoding, or the speculative method of `--spec`
/// (a `--tokens` forward without `--compare` times the spec bundle's own target prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionKind {
    Plain,
    Spec,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    pub kind: Kind,
    pub batch: usize,
    pub context: usize,
    pub session: SessionKind,
}

impl Figure {
    fn new(kind: Kind, batch: usize, context: usize) -> Figure {
        let session = match kind {
            Kind::Spec => SessionKind::Spec,
            _ => SessionKind::Plain,
        };
        Figure {
            kind,
            batch,
            context,
            session,
        }
    }

    /// New tokens per sequence in the timed target forward (1 for a decode step).
    pub fn tokens(&self) -> usize {
        match self.kind {
            Kind::Verify(t) => t,
            _ => 1,
        }
    }

    /// The step's name; `spec` is `(method, k)` of `--spec`.
    pub fn step_name(&self, spec: Option<(&str, usize)>) -> String {
        match (self.kind, spec) {
            (Kind::Decode, _) => "decode".into(),
            (Kind::Verify(t), _) => format!("verify T={t}"),
            (Kind::Spec, Some((method, k))) => format!("{method} k={k}"),
            (Kind::Spec, None) => "spec step".into(),
        }
    }

    /// The step's name with its shape, for tables of several figures.
    pub fn label(&self, spec: Option<(&str, usize)>) -> String {
        format!(
            "{} B={} ctx={}",
            self.step_name(spec),
            self.batch,
            self.context
        )
    }
}

/// What the command line asked for.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub batch: usize,
    pub context: usize,
    pub tokens: Option<usize>,
    pub spec: bool,
    pub compare: bool,
    pub suite: bool,
}

/// Batch and context of the issue-5 table, and the verify width it uses.
pub const SUITE_CONTEXT: usize = 1024;
pub const SUITE_LONG_CONTEXT: usize = 8192;
pub const SUITE_BATCH: usize = 8;
pub const SUITE_VERIFY_TOKENS: usize = 8;

/// The figures to measure, in the order they are printed.
///
/// - plain `bench`: exactly one (a verify with `--tokens`, else the spec step with `--spec`,
///   else decode), as the single-figure table has always shown;
/// - `--compare`: decode, then verify with `--tokens`, then the spec step with `--spec`;
/// - `--suite`: decode B=1 ctx 1024, verify T=8, decode B=8, decode ctx 8192 (and the spec
///   step B=1 ctx 1024 with `--spec`).
pub fn plan(r: &Request) -> Vec<Figure> {
    if r.suite {
        let (c, b) = (SUITE_CONTEXT, SUITE_BATCH);
        let mut v = vec![
            Figure::new(Kind::Decode, 1, c),
            Figure::new(Kind::Verify(SUITE_VERIFY_TOKENS), 1, c),
            Figure::new(Kind::Decode, b, c),
            Figure::new(Kind::Decode, 1, SUITE_LONG_CONTEXT),
        ];
        if r.spec {
            v.push(Figure::new(Kind::Spec, 1, c));
        }
        return v;
    }
    let (b, c) = (r.batch, r.context);
    if r.compare {
        let mut v = vec![Figure::new(Kind::Decode, b, c)];
        if let Some(t) = r.tokens {
            v.push(Figure::new(Kind::Verify(t), b, c));
        }
        if r.spec {
            v.push(Figure::new(Kind::Spec, b, c));
        }
        return v;
    }
    let mut f = match (r.tokens, r.spec) {
        (Some(t), _) => Figure::new(Kind::Verify(t), b, c),
        (None, true) => Figure::new(Kind::Spec, b, c),
        (None, false) => Figure::new(Kind::Decode, b, c),
    };
    if r.spec {
        f.session = SessionKind::Spec;
    }
    vec![f]
}

/// Figures measured on one session: indices into the plan, in plan order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionPlan {
    pub kind: SessionKind,
    pub batch: usize,
    pub context: usize,
    pub figures: Vec<usize>,
}

impl SessionPlan {
    /// KV capacity per sequence: the context, the widest forward or k + 1 verify tokens, and
    /// a margin for the step's bookkeeping.
    pub fn max_context(&self, plan: &[Figure], k: usize) -> u64 {
        let widest = self
            .figures
            .iter()
            .map(|&i| plan[i].tokens())
            .max()
            .unwrap_or(1);
        let k = if self.kind == SessionKind::Spec { k } else { 0 };
        (self.context + k.max(widest) + 16) as u64
    }
}

/// Groups figures by (session kind, batch, context), in order of first appearance.
pub fn sessions(plan: &[Figure]) -> Vec<SessionPlan> {
    let mut out: Vec<SessionPlan> = Vec::new();
    for (i, f) in plan.iter().enumerate() {
        match out
            .iter_mut()
            .find(|s| (s.kind, s.batch, s.context) == (f.session, f.batch, f.context))
        {
            Some(s) => s.figures.push(i),
            None => out.push(SessionPlan {
                kind: f.session,
                batch: f.batch,
                context: f.context,
                figures: vec![i],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Request {
        Request {
            batch: 2,
            context: 512,
            tokens: None,
            spec: false,
            compare: false,
            suite: false,
        }
    }

    #[test]
    fn single_figure_keeps_the_old_choice() {
        let spec_verify = plan(&Request {
            tokens: Some(8),
            spec: true,
            ..req()
        });
        assert_eq!(spec_verify.len(), 1);
        assert_eq!(spec_verify[0].kind, Kind::Verify(8));
        assert_eq!(spec_verify[0].session, SessionKind::Spec);
        assert_eq!(plan(&req())[0].kind, Kind::Decode);
        let spec = plan(&Request {
            spec: true,
            ..req()
        });
        assert_eq!(
            spec[0].label(Some(("draft_model", 7))),
            "draft_model k=7 B=2 ctx=512"
        );
    }

    #[test]
    fn compare_measures_decode_verify_and_spec() {
        let p = plan(&Request {
            tokens: Some(8),
            spec: true,
            compare: true,
            ..req()
        });
        let kinds: Vec<Kind> = p.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [Kind::Decode, Kind::Verify(8), Kind::Spec]);
        let s = sessions(&p);
        // Decode and verify share the plain session; the spec step has its own.
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].figures, [0, 1]);
        assert_eq!(s[0].max_context(&p, 7), 512 + 8 + 16);
        assert_eq!(s[1].kind, SessionKind::Spec);
        assert_eq!(s[1].max_context(&p, 7), 512 + 7 + 16);
    }

    #[test]
    fn suite_is_the_issue_5_table_on_four_sessions() {
        let p = plan(&Request {
            suite: true,
            spec: true,
            ..req()
        });
        let labels: Vec<String> = p
            .iter()
            .map(|f| f.label(Some(("draft_model", 7))))
            .collect();
        assert_eq!(
            labels,
            [
                "decode B=1 ctx=1024",
                "verify T=8 B=1 ctx=1024",
                "decode B=8 ctx=1024",
                "decode B=1 ctx=8192",
                "draft_model k=7 B=1 ctx=1024"
            ]
        );
        let s = sessions(&p);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].figures, [0, 1]);
    }
}
