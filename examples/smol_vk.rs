use vkllm::model::{LoadOptions, Model};
fn main() {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("../shared/reference/smollm2_reference.json").unwrap(),
    )
    .unwrap();
    let be = vkllm::vk::open(&vkllm::vk::Options::from_env()).unwrap();
    let t = std::time::Instant::now();
    let mut m = Model::load(
        be,
        std::path::Path::new("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        &LoadOptions {
            context: Some(256),
            ..Default::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    println!("load {:?}", t.elapsed());
    for r in v["refs"].as_array().unwrap() {
        let ids: Vec<u32> = r["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let want: Vec<u32> = r["greedy_32"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        m.reset();
        let t = std::time::Instant::now();
        let mut toks = vec![m.next_token(&ids).unwrap()];
        let t1 = t.elapsed();
        while toks.len() < 32 {
            let n = m.next_token(&toks[toks.len() - 1..]).unwrap();
            toks.push(n);
        }
        println!(
            "match={} prefill {:?} decode {:.1} tok/s",
            toks == want,
            t1,
            31.0 / (t.elapsed() - t1).as_secs_f64()
        );
        if toks != want {
            println!("{:?}\n{:?}", toks, want);
        }
    }
}
