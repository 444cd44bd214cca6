#[path = "../tests/common/mod.rs"]
mod common;
fn main() {
    for (l, k) in common::all_kernels(&common::LLAMA_8B) {
        if l == "attn_tile tree (T<=64)" {
            println!("{}\n{:?}", k.kernel, k.launch);
        }
    }
}
