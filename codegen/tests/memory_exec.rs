//! The static memory plan, executed: the scheduled groups run on the interpreter with every
//! value that crosses a group boundary stored in ONE byte arena at its planned offset (and
//! states and weights in their own homes). Outputs must equal a plain interpreter run bit for
//! bit; a plan whose values are deliberately overlapped must NOT (the checker catches clobbers).

use std::collections::HashMap;
use std::path::Path;

use specc_codegen::{compile, root, tensor_bytes, Group, Home, LaunchPlan};
use specc_ir::interp::{self, Data, Env, Tensor};
use specc_ir::{Bindings, DType, Graph, Op, TensorType, ValueId};
use specc_models::methods::{lower_draft_model_step, StepShape, DRAFT_PREFIX};
use specc_models::{Acceptance, Model};

fn decode(bytes: &[u8], ty: &TensorType, bind: &Bindings) -> Tensor {
    let shape = ty.shape.resolve(bind).unwrap();
    let n: usize = shape.iter().product();
    match ty.dtype {
        DType::BF16 => Tensor::from_f32(
            ty.dtype,
            shape,
            bytes[..2 * n]
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        DType::F16 => Tensor::from_f32(
            ty.dtype,
            shape,
            bytes[..2 * n]
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        DType::F32 => Tensor::from_f32(
            ty.dtype,
            shape,
            bytes[..4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        DType::I64 => Tensor::from_i64(
            ty.dtype,
            shape,
            bytes[..8 * n]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        DType::Bool => Tensor::from_i64(
            ty.dtype,
            shape,
            bytes[..n].iter().map(|&b| b as i64).collect(),
        ),
        _ => Tensor::from_i64(
            ty.dtype,
            shape,
            bytes[..4 * n]
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
        ),
    }
}

struct Planned<'a> {
    g: &'a Graph,
    plan: &'a LaunchPlan,
    arena: Vec<u8>,
    weights: &'a HashMap<String, Tensor>,
    states: HashMap<String, Tensor>,
}

impl Planned<'_> {
    fn state_name(&self, v: ValueId) -> String {
        self.g
            .node(root(self.g, v))
            .op
            .leaf_name()
            .unwrap()
            .to_string()
    }

    fn read(&self, v: ValueId) -> Tensor {
        let bind = &self.plan.bind;
        match &self.g.node(v).op {
            Op::Weight { name, .. } => self.weights[name].clone(),
            _ => match &self.plan.memory.homes[&v] {
                Home::Arena { offset, .. } => {
                    decode(&self.arena[*offset as usize..], self.g.ty(v), bind)
                }
                Home::State(_) => {
                    let r = root(self.g, v);
                    let t = self
                        .states
                        .get(&self.state_name(v))
                        .cloned()
                        .unwrap_or_else(|| {
                            let ty = self.g.ty(r);
                            Tensor::zeros(ty.dtype, ty.shape.resolve(bind).unwrap())
                        });
                    // A view of a state has the view's shape over the same elements.
                    let shape = self.g.ty(v).shape.resolve(bind).unwrap();
                    Tensor { shape, ..t }
                }
                Home::Weight(name) => self.weights[name].clone(),
                // The stacked weights, in order: their values, in the stack's shape.
                // (int4 stacks hold their values as integers, scale stacks as floats.)
                Home::WeightStack(names) => {
                    let data = match &self.weights[&names[0]].data {
                        Data::F32(_) => Data::F32(
                            names
                                .iter()
                                .flat_map(|n| self.weights[n].as_f32().unwrap().to_vec())
                                .collect(),
                        ),
                        Data::I64(_) => Data::I64(
                            names
                                .iter()
                                .flat_map(|n| self.weights[n].as_i64().unwrap().to_vec())
                                .collect(),
                        ),
                    };
                    let ty = self.g.ty(v);
                    Tensor {
                        dtype: ty.dtype,
                        shape: ty.shape.resolve(bind).unwrap(),
                        data,
                    }
                }
                // The gathered blocks of the weight's values, in the slice's shape.
                Home::WeightBlocks(b) => {
                    let dequantized;
                    let src = match &b.dequant {
                        None => &self.weights[&b.name],
                        Some(d) => {
                            let (w, s) = (&self.weights[&b.name], &self.weights[&d.scale]);
                            dequantized = interp::dequantize_weight(w, s, d.to).unwrap();
                            &dequantized
                        }
                    };
                    let Data::F32(src) = &src.data else {
                        panic!("weight {} is not a float tensor", b.name);
                    };
                    let (period, start, len) =
                        (b.period as usize, b.start as usize, b.len as usize);
                    let data = src
                        .chunks_exact(period)
                        .flat_map(|blk| blk[start..start + len].iter().copied())
                        .collect();
                    let ty = self.g.ty(v);
                    Tensor {
                        dtype: ty.dtype,
                        shape: ty.shape.resolve(bind).unwrap(),
                        data: Data::F32(data),
                    }
                }
                Home::Const(bytes) => decode(bytes, self.g.ty(v), bind),
            },
        }
    }

    fn run(
        &mut self,
        groups: &[Group],
        inputs: &HashMap<String, Tensor>,
    ) -> HashMap<String, Tensor> {
        let bind = self.plan.bind.clone();
        for (id, n) in self.g.nodes() {
            if let Op::Input { name, .. } = &n.op {
                if let Some(Home::Arena { offset, .. }) = self.plan.memory.homes.get(&id) {
                    let bytes = tensor_bytes(&inputs[name]);
                    self.arena[*offset as usize..][..bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
        for gr in groups {
            let mut local: HashMap<ValueId, Tensor> = HashMap::new();
            for &id in &gr.nodes {
                let node = self.g.node(id);
                let args: Vec<Tensor> = node
                    .args
                    .iter()
                    .map(|a| local.get(a).cloned().unwrap_or_else(|| self.read(*a)))
                    .collect();
                let refs: Vec<&Tensor> = args.iter().collect();
                if node.op.is_in_place() {
                    let name = self.state_name(id);
                    let mut st = self.states.remove(&name).unwrap_or_else(|| args[0].clone());
                    interp::apply_in_place(id, node, &mut st, &refs[1..]).unwrap();
                    local.insert(id, st.clone());
                    self.states.insert(name, st);
                } else {
                    local.insert(id, interp::eval_node(id, node, &refs, &bind).unwrap());
                }
            }
            for &o in &gr.outputs {
                if let Some(Home::Arena { offset, .. }) = self.plan.memory.homes.get(&o) {
                    let bytes = tensor_bytes(&local[&o]);
                    self.arena[*offset as usize..][..bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
        self.g
            .outputs()
            .iter()
            .map(|(n, v)| (n.clone(), self.read(*v)))
            .collect()
    }
}

fn reference(
    g: &Graph,
    bind: &Bindings,
    w: &HashMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
    states: &HashMap<String, Tensor>,
) -> HashMap<String, Tensor> {
    let mut st = states.clone();
    let mut env = Env {
        bind: bind.clone(),
        inputs: inputs.clone(),
        weights: w,
        states: &mut st,
    };
    interp::run(g, &mut env).unwrap()
}

/// Runs the plan as given and with every arena value moved to offset 0; returns whether each
/// matches the reference, and how many folded constants the plan reads.
fn check(
    g: Graph,
    bind: Bindings,
    w: &HashMap<String, Tensor>,
    inputs: HashMap<String, Tensor>,
    states: HashMap<String, Tensor>,
) -> (bool, bool, usize) {
    let c = compile(g, std::slice::from_ref(&bind)).unwrap();
    let want = reference(&c.graph, &bind, w, &inputs, &states);
    let plan = &c.plans[0];
    let mut ok = Planned {
        g: &c.graph,
        plan,
        arena: vec![0xA5; plan.memory.arena_bytes as usize],
        weights: w,
        states: states.clone(),
    };
    let got = ok.run(&c.groups, &inputs);
    let mut clobbered = plan.clone();
    let max = clobbered
        .memory
        .homes
        .values()
        .filter_map(|h| match h {
            Home::Arena { bytes, .. } => Some(*bytes),
            _ => None,
        })
        .max()
        .unwrap();
    for h in clobbered.memory.homes.values_mut() {
        if let Home::Arena { offset, .. } = h {
            *offset = 0;
        }
    }
    let mut bad = Planned {
        g: &c.graph,
        plan: &clobbered,
        arena: vec![0xA5; max as usize + 64],
        weights: w,
        states,
    };
    let got_bad = bad.run(&c.groups, &inputs);
    let constants = plan
        .memory
        .homes
        .values()
        .filter(|h| matches!(h, Home::Const(_)))
        .count();
    (got == want, got_bad == want, constants)
}

fn ids(rows: &[Vec<i64>]) -> Tensor {
    Tensor::from_i64(DType::I32, vec![rows.len(), rows[0].len()], rows.concat())
}

fn fixture(name: &str) -> Model {
    Model::open(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name),
    )
    .unwrap()
}

#[test]
fn dense_prefill_runs_over_the_planned_arena() {
    // The quantised DeepSeek-V3 fixtures: int4 expert stacks with their scale stacks, fp8
    // Linears and MLA's dequantised kv_b, in their planned homes.
    for name in [
        "llama3_scaled_untied",
        "qwen3_headdim",
        "deepseek_v3_int4",
        "deepseek_v3_fp8",
    ] {
        let m = fixture(name);
        let inputs = HashMap::from([
            (
                "tokens".to_string(),
                ids(&[vec![1, 5, 9, 2, 7], vec![3, 3, 8, 1, 0]]),
            ),
            (
                "positions".to_string(),
                ids(&[vec![0, 1, 2, 3, 4], vec![0, 1, 2, -1, -1]]),
            ),
        ]);
        let (ok, clobber_ok, _) = check(
            m.graph().clone(),
            Bindings::new(2, 5, 16),
            &m.load_weights_f32(),
            inputs,
            HashMap::new(),
        );
        assert!(ok, "{name}: planned execution differs from the interpreter");
        assert!(
            !clobber_ok,
            "{name}: overlapping every value went unnoticed"
        );
    }
}

#[test]
fn speculative_step_runs_over_the_planned_arena() {
    let t = fixture("llama3_scaled_untied");
    let d = fixture("qwen3_headdim");
    let shape = StepShape {
        num_steps: 3,
        ring: 16,
        acceptance: Acceptance::Greedy,
    };
    let g = lower_draft_model_step(t.spec(), d.spec(), &shape).unwrap();
    let mut w = t.load_weights_f32();
    for (n, v) in d.load_weights_f32() {
        w.insert(format!("{DRAFT_PREFIX}{n}"), v);
    }
    let lane = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![v.len()], v);
    let states = HashMap::from([
        ("spec.len".to_string(), lane(vec![4, 6])),
        (
            "spec.pending".to_string(),
            Tensor::from_i64(DType::I32, vec![2, 2], vec![7, 9, 11, 13]),
        ),
        ("spec.budget".to_string(), lane(vec![10, 0])),
        ("spec.emitted".to_string(), lane(vec![0, 0])),
        ("spec.step".to_string(), lane(vec![0, 0])),
    ]);
    let (ok, clobber_ok, constants) = check(g, Bindings::new(2, 1, 32), &w, HashMap::new(), states);
    assert!(constants > 0, "the step's bookkeeping constants are folded");
    assert!(
        ok,
        "planned execution of the step differs from the interpreter"
    );
    assert!(!clobber_ok, "overlapping every value went unnoticed");
}

/// The DDTree step (tree build, tree-masked verify with node slots, tree accept, `kv_move`
/// commit) over the planned arena: in-place moves after the verify's reads of the caches.
#[test]
fn ddtree_step_runs_over_the_planned_arena() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama3_scaled_untied");
    let t = fixture("llama3_scaled_untied");
    let cfg = specc_models::SpecConfig::from_toml(
        &dir.join("spec.ddtree-test.toml"),
        "method = \"ddtree\"\ndraft = \"../dflash_random\"\nbudget = 70\ntopk = 4\n",
    )
    .unwrap();
    let b = specc_models::SpecBundle::open(&t, &cfg).unwrap();
    let w = b.load_weights_f32(&t).unwrap();
    let lane = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![v.len()], v);
    let states = HashMap::from([
        ("spec.len".to_string(), lane(vec![4, 6])),
        (
            "spec.pending".to_string(),
            Tensor::from_i64(DType::I32, vec![2, 2], vec![7, 9, 11, 13]),
        ),
        ("spec.budget".to_string(), lane(vec![10, 0])),
        ("spec.emitted".to_string(), lane(vec![0, 0])),
        ("spec.step".to_string(), lane(vec![0, 0])),
        ("dflash.count".to_string(), lane(vec![0, 0])),
        ("dflash.base".to_string(), lane(vec![4, 6])),
    ]);
    let (ok, clobber_ok, constants) =
        check(b.step, Bindings::new(2, 1, 128), &w, HashMap::new(), states);
    assert!(constants > 0, "the step's bookkeeping constants are folded");
    assert!(
        ok,
        "planned execution of the ddtree step differs from the interpreter"
    );
    assert!(!clobber_ok, "overlapping every value went unnoticed");
}
