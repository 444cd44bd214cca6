//! Parsing the text form back into a verified [`Graph`]. Every error is
//! [`IrError::Parse`] naming the 1-based line it is about.

use super::lex::{lex, Cursor, Tok};
use super::print::{
    attn_mask_name, moe_scoring_name, parse_f64, rope_style_name, ATTN_MASKS, MOE_SCORINGS,
    ROPE_STYLES,
};
use crate::{
    BinaryOp, DType, Dim, Graph, IrError, Node, Op, ReduceOp, RopeScaling, Shape, TensorType,
    UnaryOp,
};

/// Parses IR text. Each node line is type-checked against [`Op::infer`] as it is read, and
/// the whole graph is then run through [`crate::verify`], so the result is a valid graph.
pub fn parse(src: &str) -> Result<Graph, IrError> {
    let mut p = Parser {
        state: State::Header,
        g: Graph::default(),
        node_lines: Vec::new(),
        output_lines: Vec::new(),
    };
    let mut last = 0;
    for (i, text) in src.lines().enumerate() {
        let line = i + 1;
        last = line;
        let toks = lex(text).map_err(|msg| IrError::Parse { line, msg })?;
        if !toks.is_empty() {
            p.line(line, Cursor::new(toks))
                .map_err(|msg| IrError::Parse { line, msg })?;
        }
    }
    p.finish(last.max(1))
}

enum State {
    /// Expecting `graph NAME {`.
    Header,
    /// Inside the braces.
    Body,
    /// After the closing `}`: only blank lines and comments may follow.
    Done,
}

struct Parser {
    state: State,
    g: Graph,
    /// Line of each node, by value index.
    node_lines: Vec<usize>,
    /// Line of each output, in output order.
    output_lines: Vec<usize>,
}

impl Parser {
    fn line(&mut self, line: usize, mut c: Cursor) -> Result<(), String> {
        match self.state {
            State::Header => {
                if c.peek() != Some(&Tok::Ident("graph".into())) {
                    return Err(format!("expected `graph NAME {{`, found {}", c.found()));
                }
                c.next();
                self.g.name = match c.next() {
                    Some(Tok::Ident(s) | Tok::Str(s)) => s,
                    other => return Err(format!("expected a graph name, found {}", tok(other))),
                };
                c.expect('{')?;
                c.end()?;
                self.state = State::Body;
                Ok(())
            }
            State::Body => match c.peek() {
                Some(Tok::Value(_)) => self.node(line, c),
                Some(Tok::Ident(s)) if s == "output" => self.output(line, c),
                Some(Tok::Punct('}')) => {
                    c.next();
                    c.end()?;
                    self.state = State::Done;
                    Ok(())
                }
                _ => Err(format!(
                    "expected `%N = ...`, `output \"NAME\" = %N` or `}}`, found {}",
                    c.found()
                )),
            },
            State::Done => Err(format!("unexpected {} after the closing `}}`", c.found())),
        }
    }

    /// `%N = op{attrs} "name" %a, %b : type`
    fn node(&mut self, line: usize, mut c: Cursor) -> Result<(), String> {
        let id = c.value()?;
        let want = self.g.len();
        if id.index() < want {
            return Err(format!(
                "duplicate id {id}, already defined on line {}",
                self.node_lines[id.index()]
            ));
        }
        if id.index() > want {
            return Err(format!(
                "id {id} out of order: ids must be dense 0..n in order, expected %{want}"
            ));
        }
        c.expect('=')?;
        let name = c.ident("an op name")?;
        let mut attrs = Attrs::new(&name);
        if c.eat('{') {
            attrs.items = attr_items(&mut c, '}')?;
        }
        let leaf_name = match c.peek() {
            Some(Tok::Str(_)) => Some(c.string("a name")?),
            _ => None,
        };
        let mut args = Vec::new();
        if !c.is_punct(':') {
            loop {
                let a = c.value()?;
                if a.index() >= self.g.len() {
                    return Err(format!(
                        "undefined value {a}: values must be defined before they are used"
                    ));
                }
                args.push(a);
                if !c.eat(',') {
                    break;
                }
            }
        }
        c.expect(':')?;
        let ty = parse_type(&mut c)?;
        c.end()?;
        let op = build_op(&name, attrs, leaf_name, &ty)?;
        let arg_tys: Vec<&TensorType> = args.iter().map(|&a| self.g.ty(a)).collect();
        let inferred = op.infer(&arg_tys).map_err(|m| format!("{name}: {m}"))?;
        if inferred != ty {
            return Err(format!("type {ty} is wrong: {name} gives {inferred}"));
        }
        self.g.push_unchecked(Node { op, args, ty });
        self.node_lines.push(line);
        Ok(())
    }

    /// `output "NAME" = %N`
    fn output(&mut self, line: usize, mut c: Cursor) -> Result<(), String> {
        c.next();
        let name = c.string("a quoted output name")?;
        c.expect('=')?;
        let v = c.value()?;
        c.end()?;
        if v.index() >= self.g.len() {
            return Err(format!("undefined value {v} for output `{name}`"));
        }
        if self.g.output(&name).is_some() {
            return Err(format!("duplicate output name `{name}`"));
        }
        self.g.set_output(&name, v);
        self.output_lines.push(line);
        Ok(())
    }

    /// Checks the graph is complete and valid; a verifier error names the line of the
    /// node or output it is about.
    fn finish(self, last: usize) -> Result<Graph, IrError> {
        match self.state {
            State::Header => Err(IrError::Parse {
                line: last,
                msg: "expected `graph NAME {`, found end of input".into(),
            }),
            State::Body => Err(IrError::Parse {
                line: last,
                msg: "missing the closing `}`".into(),
            }),
            State::Done => match crate::verify(&self.g) {
                Ok(()) => Ok(self.g),
                Err(e) => {
                    let line = match &e {
                        IrError::UnknownValue { node, .. }
                        | IrError::Type { node, .. }
                        | IrError::Verify { node, .. } => self.node_lines[node.index()],
                        IrError::Output { name, .. } => self
                            .g
                            .outputs()
                            .iter()
                            .position(|(n, _)| n == name)
                            .map_or(last, |i| self.output_lines[i]),
                        IrError::Parse { line, .. } => *line,
                        IrError::Interp(_) => last,
                    };
                    Err(IrError::Parse {
                        line,
                        msg: e.to_string(),
                    })
                }
            },
        }
    }
}

fn tok(t: Option<Tok>) -> String {
    t.map_or("end of line".into(), |t| format!("`{t}`"))
}

/// `dtype[dim, ...]`
fn parse_type(c: &mut Cursor) -> Result<TensorType, String> {
    let d = c.ident("a type such as `bf16[B,T,64]`")?;
    let dtype = d.parse::<DType>().map_err(|e| format!("bad type: {e}"))?;
    let shape = parse_shape(c).map_err(|e| format!("bad type: {e}"))?;
    Ok(TensorType { dtype, shape })
}

/// `[B,T,64]`, `[]`
fn parse_shape(c: &mut Cursor) -> Result<Shape, String> {
    c.expect('[')?;
    let mut dims = Vec::new();
    if c.eat(']') {
        return Ok(Shape(dims));
    }
    loop {
        match c.next() {
            Some(Tok::Num(s) | Tok::Ident(s)) => dims.push(s.parse::<Dim>()?),
            other => return Err(format!("expected a dim, found {}", tok(other))),
        }
        if c.eat(']') {
            return Ok(Shape(dims));
        }
        c.expect(',')?;
    }
}

/// An attribute value before it is given a meaning by its key.
enum Val {
    /// A number or a bare word: `8`, `1e-5`, `-inf`, `true`, `bf16`, `causal`.
    Word(String),
    /// `[B,T,64]`
    Shape(Shape),
    /// `llama3(factor=8.0, ...)`
    Call(String, Vec<(String, Val)>),
}

/// `key=val, ...` up to and including `close`; the opening bracket is already consumed.
fn attr_items(c: &mut Cursor, close: char) -> Result<Vec<(String, Val)>, String> {
    let mut items: Vec<(String, Val)> = Vec::new();
    if c.eat(close) {
        return Ok(items);
    }
    loop {
        let key = c.ident("an attribute name")?;
        if items.iter().any(|(k, _)| *k == key) {
            return Err(format!("duplicate attribute `{key}`"));
        }
        c.expect('=')?;
        let val = if c.is_punct('[') {
            Val::Shape(parse_shape(c)?)
        } else {
            match (c.next(), c.peek()) {
                (Some(Tok::Ident(f)), Some(Tok::Punct('('))) => {
                    c.next();
                    Val::Call(f, attr_items(c, ')')?)
                }
                (Some(Tok::Ident(s) | Tok::Num(s)), _) => Val::Word(s),
                (other, _) => {
                    return Err(format!(
                        "expected a value for `{key}`, found {}",
                        tok(other)
                    ))
                }
            }
        };
        items.push((key, val));
        if c.eat(close) {
            return Ok(items);
        }
        c.expect(',')?;
    }
}

/// The attributes of one op (or of one `name(...)` value), taken by key; anything left
/// over at [`Attrs::done`] is an unknown attribute.
struct Attrs {
    owner: String,
    items: Vec<(String, Val)>,
}

impl Attrs {
    fn new(owner: &str) -> Self {
        Attrs {
            owner: owner.into(),
            items: Vec::new(),
        }
    }

    fn take(&mut self, key: &str) -> Result<Val, String> {
        let i = self
            .items
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| format!("`{}` needs attribute `{key}`", self.owner))?;
        Ok(self.items.remove(i).1)
    }

    fn word(&mut self, key: &str, what: &str) -> Result<String, String> {
        match self.take(key)? {
            Val::Word(s) => Ok(s),
            _ => Err(format!(
                "attribute `{key}` of `{}`: expected {what}",
                self.owner
            )),
        }
    }

    fn parsed<T>(
        &mut self,
        key: &str,
        what: &str,
        f: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        let s = self.word(key, what)?;
        f(&s).ok_or_else(|| {
            format!(
                "attribute `{key}` of `{}`: expected {what}, got `{s}`",
                self.owner
            )
        })
    }

    fn f64(&mut self, key: &str) -> Result<f64, String> {
        self.parsed(key, "a float", parse_f64)
    }

    fn u64(&mut self, key: &str) -> Result<u64, String> {
        self.parsed(key, "an unsigned integer", |s| s.parse().ok())
    }

    fn usize(&mut self, key: &str) -> Result<usize, String> {
        self.parsed(key, "an unsigned integer", |s| s.parse().ok())
    }

    fn bool(&mut self, key: &str) -> Result<bool, String> {
        self.parsed(key, "`true` or `false`", |s| s.parse().ok())
    }

    fn dtype(&mut self, key: &str) -> Result<DType, String> {
        self.parsed(key, "a dtype", |s| s.parse().ok())
    }

    /// A word naming one of `all`, by `name`.
    fn one_of<T: Copy>(
        &mut self,
        key: &str,
        all: &[T],
        name: fn(T) -> &'static str,
    ) -> Result<T, String> {
        let names: Vec<&str> = all.iter().map(|&x| name(x)).collect();
        let what = format!("one of {}", names.join(", "));
        self.parsed(key, &what, |s| all.iter().copied().find(|&x| name(x) == s))
    }

    fn shape(&mut self, key: &str) -> Result<Shape, String> {
        match self.take(key)? {
            Val::Shape(s) => Ok(s),
            _ => Err(format!(
                "attribute `{key}` of `{}`: expected a shape `[...]`",
                self.owner
            )),
        }
    }

    fn rope_scaling(&mut self, key: &str) -> Result<RopeScaling, String> {
        let what = "`none`, `llama3(...)` or `yarn(...)`";
        let (f, items) = match self.take(key)? {
            Val::Word(w) if w == "none" => return Ok(RopeScaling::None),
            Val::Call(f, items) => (f, items),
            _ => {
                return Err(format!(
                    "attribute `{key}` of `{}`: expected {what}",
                    self.owner
                ))
            }
        };
        let mut a = Attrs { owner: f, items };
        let s = match a.owner.as_str() {
            "llama3" => RopeScaling::Llama3 {
                factor: a.f64("factor")?,
                low_freq_factor: a.f64("low")?,
                high_freq_factor: a.f64("high")?,
                original_max_position: a.u64("orig")?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: a.f64("factor")?,
                original_max_position: a.u64("orig")?,
                beta_fast: a.f64("beta_fast")?,
                beta_slow: a.f64("beta_slow")?,
                mscale: a.f64("mscale")?,
            },
            other => return Err(format!("unknown rope scaling `{other}`: expected {what}")),
        };
        a.done()?;
        Ok(s)
    }

    fn done(self) -> Result<(), String> {
        match self.items.first() {
            None => Ok(()),
            Some((k, _)) => Err(format!("unknown attribute `{k}` for `{}`", self.owner)),
        }
    }
}

/// The op called `name` with its attributes; `ty` is the line's type, which a leaf
/// declares as its own.
fn build_op(
    name: &str,
    mut a: Attrs,
    leaf_name: Option<String>,
    ty: &TensorType,
) -> Result<Op, String> {
    let named = matches!(name, "input" | "weight" | "state");
    let leaf = match (named, leaf_name) {
        (true, Some(n)) => n,
        (true, None) => return Err(format!("`{name}` needs a quoted name")),
        (false, Some(n)) => return Err(format!("`{name}` takes no name, found \"{n}\"")),
        (false, None) => String::new(),
    };
    let ty = ty.clone();
    let op = match name {
        "input" => Op::Input { name: leaf, ty },
        "weight" => Op::Weight { name: leaf, ty },
        "state" => Op::State { name: leaf, ty },
        "fill" => Op::Fill {
            value: a.f64("value")?,
            ty,
        },
        "iota" => Op::Iota {
            axis: a.usize("axis")?,
            ty,
        },
        "silu_mul" => Op::SiluMul,
        "cast" => Op::Cast { to: a.dtype("to")? },
        "dequantize" => Op::Dequantize { to: a.dtype("to")? },
        "select" => Op::Select,
        "reshape" => Op::Reshape {
            shape: a.shape("shape")?,
        },
        "slice" => Op::Slice {
            axis: a.usize("axis")?,
            start: a.u64("start")?,
            len: a.u64("len")?,
        },
        "concat" => Op::Concat {
            axis: a.usize("axis")?,
        },
        "gather" => Op::Gather {
            axis: a.usize("axis")?,
        },
        "argmax" => Op::Argmax,
        "topk" => Op::TopK { k: a.u64("k")? },
        "softmax" => Op::Softmax,
        "embedding" => Op::Embedding,
        "rmsnorm" => Op::RmsNorm { eps: a.f64("eps")? },
        "matmul" => Op::MatMul,
        "rope" => Op::Rope {
            theta: a.f64("theta")?,
            scaling: a.rope_scaling("scaling")?,
            style: a.one_of("style", &ROPE_STYLES, rope_style_name)?,
            rotary_dim: a.u64("rotary_dim")?,
        },
        "kv_write" => Op::KvWrite,
        "assign" => Op::Assign,
        "attention" => Op::Attention {
            scale: a.f64("scale")?,
            mask: a.one_of("mask", &ATTN_MASKS, attn_mask_name)?,
        },
        "head_matmul" => Op::HeadMatMul {
            trans_w: a.bool("trans_w")?,
        },
        "mla_attention" => Op::MlaAttention {
            scale: a.f64("scale")?,
            mask: a.one_of("mask", &ATTN_MASKS, attn_mask_name)?,
        },
        "sample" => Op::Sample,
        "top_p_threshold" => Op::TopPThreshold,
        "top_k_threshold" => Op::TopKThreshold,
        "random_uniform" => Op::RandomUniform {
            seed: a.u64("seed")?,
        },
        "accept_chain" => Op::AcceptChain,
        "tree_build" => Op::TreeBuild {
            budget: a.u64("budget")?,
        },
        "tree_accept" => Op::TreeAccept {
            max_depth: a.u64("max_depth")?,
        },
        "tree_select" => Op::TreeSelect {
            nodes: a.u64("nodes")?,
        },
        "kv_move" => Op::KvMove,
        "moe_route" => Op::MoeRoute {
            top_k: a.u64("top_k")?,
            scoring: a.one_of("scoring", &MOE_SCORINGS, moe_scoring_name)?,
            n_group: a.u64("n_group")?,
            topk_group: a.u64("topk_group")?,
            norm_topk_prob: a.bool("norm_topk_prob")?,
            scaling: a.f64("scaling")?,
        },
        "moe_experts" => Op::MoeExperts,
        "all_reduce" => Op::AllReduce,
        "copy" => Op::Copy,
        other => {
            if let Some(&b) = BinaryOp::ALL.iter().find(|b| b.name() == other) {
                Op::Binary(b)
            } else if let Some(&u) = UnaryOp::ALL.iter().find(|u| u.name() == other) {
                Op::Unary(u)
            } else if let Some(&r) = ReduceOp::ALL.iter().find(|r| r.name() == other) {
                Op::Reduce(r)
            } else {
                return Err(format!("unknown op `{other}`"));
            }
        }
    };
    a.done()?;
    Ok(op)
}
