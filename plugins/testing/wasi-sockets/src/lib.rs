//! Test plugin: opens a TCP connection, so it imports wasi:sockets. The host
//! must refuse to load it.
wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

struct P;
impl Guest for P {
    fn check_config(_: String) -> Result<(), String> {
        Ok(())
    }
    fn handle(_: ChangeEvent) -> Result<Vec<Action>, String> {
        std::net::TcpStream::connect("127.0.0.1:80")
            .map(|_| Vec::new())
            .map_err(|e| e.to_string())
    }
}
export!(P);
