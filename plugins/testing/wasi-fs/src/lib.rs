//! Test plugin: reads a file, so it imports wasi:filesystem. The host must
//! refuse to load it.
wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

struct P;
impl Guest for P {
    fn check_config(_: String) -> Result<(), String> {
        Ok(())
    }
    fn handle(_: ChangeEvent) -> Result<Vec<Action>, String> {
        std::fs::read_to_string("/etc/passwd")
            .map(|_| Vec::new())
            .map_err(|e| e.to_string())
    }
}
export!(P);
