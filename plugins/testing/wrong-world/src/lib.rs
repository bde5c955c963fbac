//! Test plugin: a valid component of some other world. The host must refuse it.
wit_bindgen::generate!({
    inline: "
        package test:other@1.0.0;
        world other {
            export run: func(input: string) -> string;
        }
    ",
});

struct P;
impl Guest for P {
    fn run(input: String) -> String {
        input
    }
}
export!(P);
