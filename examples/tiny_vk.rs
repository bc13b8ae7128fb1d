use vkllm::model::{LoadOptions, Model, Output, Want};
fn main() {
    let arch = std::env::args().nth(1).unwrap();
    let dir = std::path::PathBuf::from("../shared/reference/tiny").join(&arch);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids: Vec<u32> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let refl: Vec<f32> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect();
    let be = vkllm::vk::open(&vkllm::vk::Options::from_env()).unwrap();
    let mut m = Model::load(be, &dir, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let Output::Logits(l) = m.forward(&ids, Want::AllLogits).unwrap() else {
        panic!()
    };
    let err = l
        .iter()
        .zip(&refl)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("{arch}: max err {err}");
}
