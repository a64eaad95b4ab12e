fn main() {
    for crd in basecamp_api::crd::all() {
        println!("---\n{}", basecamp_api::crd::to_yaml(&crd).expect("yaml"));
    }
}
