fn main() {
    let d: k8s_openapi::api::apps::v1::Deployment =
        serde_json::from_str(&std::fs::read_to_string("/tmp/dbg-dep.json").unwrap()).unwrap();
    let mw: mw_operator::resource::ManagedWorkload =
        serde_json::from_str(&std::fs::read_to_string("/tmp/dbg-mw.json").unwrap()).unwrap();
    let desired = mw_operator::desired::deployment(&mw).unwrap();
    println!(
        "same {} up {}",
        mw_operator::drift::same_desired(&desired, &d),
        mw_operator::drift::up_to_date(&desired, &d)
    );
    println!("{}", serde_json::to_string(&desired).unwrap());
    println!("{:?}", mw_operator::drift::owned_fields(&d).is_some());
}
