//! MoE benchmarks (written below).

fn main() {}
