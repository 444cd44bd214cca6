//! A structured CUDA C++ emitter: an indenting writer whose blocks open and close braces
//! themselves, so generated code is built from structure and never edited after printing.
//!
//! Every statement goes through [`Writer::line`] (usually via the `emit!` macro) at the
//! current depth; every brace pair comes from a `*_block` method taking a closure for the
//! body, so braces always balance and indentation always matches nesting.

use std::fmt::Write as _;

/// Indentation unit of generated code.
const INDENT: &str = "  ";

/// An indenting text buffer for C++ source.
#[derive(Debug, Default)]
pub struct Writer {
    buf: String,
    depth: usize,
}

/// `emit!(w, "fmt", args...)` writes one formatted line at the writer's depth.
macro_rules! emit {
    ($w:expr, $($arg:tt)*) => {
        $w.line(::std::format_args!($($arg)*))
    };
}
pub(crate) use emit;

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer whose lines start at `depth` (the body of a function starts at 1).
    pub fn at_depth(depth: usize) -> Self {
        Writer {
            buf: String::new(),
            depth,
        }
    }

    /// One line at the current depth.
    pub fn line(&mut self, text: impl std::fmt::Display) {
        for _ in 0..self.depth {
            self.buf.push_str(INDENT);
        }
        // Writing into a String cannot fail.
        let _ = writeln!(self.buf, "{text}");
    }

    /// An empty line (no indentation).
    pub fn blank(&mut self) {
        self.buf.push('\n');
    }

    /// A `// ...` comment line.
    pub fn comment(&mut self, text: impl std::fmt::Display) {
        self.line(format_args!("// {text}"));
    }

    /// `head {`, the body one level deeper, `}`.
    pub fn block(&mut self, head: impl std::fmt::Display, body: impl FnOnce(&mut Writer)) {
        self.line(format_args!("{head} {{"));
        self.depth += 1;
        body(self);
        self.depth -= 1;
        self.line("}");
    }

    /// `head {`, the body, `};`: aggregate initialisers and type definitions.
    pub fn block_semi(&mut self, head: impl std::fmt::Display, body: impl FnOnce(&mut Writer)) {
        self.line(format_args!("{head} {{"));
        self.depth += 1;
        body(self);
        self.depth -= 1;
        self.line("};");
    }

    /// A bare `{ ... }` scope.
    pub fn scope(&mut self, body: impl FnOnce(&mut Writer)) {
        self.line("{");
        self.depth += 1;
        body(self);
        self.depth -= 1;
        self.line("}");
    }

    /// A function definition: `signature { body }`.
    pub fn fn_block(&mut self, signature: impl std::fmt::Display, body: impl FnOnce(&mut Writer)) {
        self.block(signature, body);
    }

    /// `for (init; cond; step) { body }`.
    pub fn for_block(
        &mut self,
        init: impl std::fmt::Display,
        cond: impl std::fmt::Display,
        step: impl std::fmt::Display,
        body: impl FnOnce(&mut Writer),
    ) {
        self.block(format_args!("for ({init}; {cond}; {step})"), body);
    }

    /// `#pragma unroll` followed by `for (int var = start; var < end; ++var) { body }`:
    /// a loop with a compile-time trip count, fully unrolled.
    pub fn for_unrolled(
        &mut self,
        var: &str,
        start: impl std::fmt::Display,
        end: impl std::fmt::Display,
        body: impl FnOnce(&mut Writer),
    ) {
        self.line("#pragma unroll");
        self.for_block(
            format_args!("int {var} = {start}"),
            format_args!("{var} < {end}"),
            format_args!("++{var}"),
            body,
        );
    }

    /// `while (cond) { body }`.
    pub fn while_block(&mut self, cond: impl std::fmt::Display, body: impl FnOnce(&mut Writer)) {
        self.block(format_args!("while ({cond})"), body);
    }

    /// `if (cond) { body }`.
    pub fn if_block(&mut self, cond: impl std::fmt::Display, body: impl FnOnce(&mut Writer)) {
        self.block(format_args!("if ({cond})"), body);
    }

    /// `if (cond) { then } else { otherwise }`.
    pub fn if_else(
        &mut self,
        cond: impl std::fmt::Display,
        then: impl FnOnce(&mut Writer),
        otherwise: impl FnOnce(&mut Writer),
    ) {
        self.line(format_args!("if ({cond}) {{"));
        self.depth += 1;
        then(self);
        self.depth -= 1;
        self.line("} else {");
        self.depth += 1;
        otherwise(self);
        self.depth -= 1;
        self.line("}");
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.buf
    }
}

/// A C++ `float` literal that parses back to exactly `x` (shortest round-trip decimal).
/// Non-finite values are rejected by generators before printing.
pub fn f32_lit(x: f32) -> String {
    debug_assert!(x.is_finite(), "non-finite literal {x}");
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) {
        format!("{s}f")
    } else {
        format!("{s}.0f")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_nest_and_balance() {
        let mut w = Writer::new();
        w.fn_block("__device__ void f(int n)", |w| {
            emit!(w, "int s = {};", 0);
            w.for_unrolled("i", 0, 4, |w| {
                w.if_else("i < n", |w| w.line("s += i;"), |w| w.line("s -= i;"));
            });
            w.comment("done");
        });
        let text = w.finish();
        let want = "\
__device__ void f(int n) {
  int s = 0;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (i < n) {
      s += i;
    } else {
      s -= i;
    }
  }
  // done
}
";
        assert_eq!(text, want);
    }

    #[test]
    fn float_literals_round_trip() {
        for x in [
            1.0f32,
            1e-5,
            1e-6,
            0.5,
            1234567.0,
            3.4028235e38,
            1e-40,
            -2.5,
        ] {
            let lit = f32_lit(x);
            assert!(lit.ends_with('f'), "{lit}");
            let back: f32 = lit.trim_end_matches('f').parse().unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{lit}");
        }
        assert_eq!(f32_lit(1.0), "1.0f");
        assert_eq!(f32_lit(1e-5), "1e-5f");
    }
}
