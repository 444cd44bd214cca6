//! The IR text form (DESIGN.md §4): printing then parsing gives back an equal graph, so
//! IR-level golden tests are plain text files.
//!
//! ```text
//! file   := 'graph' (IDENT | STRING) '{' NL  line*  '}' NL
//! line   := node | output                     one per line; `//` comments, blank lines ok
//! node   := '%' N '=' OP attrs? STRING? args? ':' type
//!             N counts 0, 1, 2, ... in order; STRING only (and always) on input/weight/state
//! args   := '%' N (',' '%' N)*                each defined on an earlier line
//! attrs  := '{' (KEY '=' val (',' KEY '=' val)*)? '}'   printed in a fixed key order
//! val    := NUMBER | WORD | shape | WORD '(' KEY '=' val, ... ')'    e.g. llama3(factor=8.0, ...)
//! type   := DTYPE shape                       bf16[B,T,64], int4g32[256,128], f32[]
//! output := 'output' STRING '=' '%' N
//! ```
//! Every node carries its result type; a leaf (`input`, `weight`, `state`, `fill`, `iota`)
//! declares it, and for every other op the parser checks it against [`crate::Op::infer`].
//! Floats print in Rust's shortest round-trip form (`1e-5`, `500000.0`, `-inf`; NaNs as
//! `nan` or `nan_0x<bits>`), so they read back bit-exactly. Strings escape `"`, `\`, and
//! control characters (`\n`, `\u{1b}`).

mod lex;
mod parse;
mod print;

pub use parse::parse;
pub use print::print;

#[cfg(test)]
mod tests;
