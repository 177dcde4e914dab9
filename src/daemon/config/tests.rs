//! Unit tests of the configuration: the example file, defaults, refusals naming the key.
use super::*;

const MINIMAL: &str = r#"
[listen]
tcp = "127.0.0.1:0"
[paths]
outbox = "out"
state = "/var/lib/hsiedge"
control = "/run/hsiedge/control.sock"
[models.tiny]
manifest = "/m/tiny/manifest.json"
"#;

fn load_str(text: &str) -> Result<Config, ConfigError> {
    parse(text, Path::new("/etc/hsiedge/hsiedge.toml"))?.validate(Path::new("/etc/hsiedge/hsiedge.toml"))
}

#[test]
fn the_example_file_parses_and_validates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/hsiedge.toml");
    let c = load(&path).unwrap();
    assert!(c.tcp.is_some() && c.unix.is_some());
    assert_eq!(c.intake.segment_lines, defaults::SEGMENT_LINES);
    assert!(!c.models.is_empty());
    // Every key the raw structs know is written out (commented or not) in the example.
    let text = std::fs::read_to_string(&path).unwrap();
    for key in [
        "tcp",
        "unix",
        "outbox",
        "state",
        "control",
        "default_model",
        "segment_lines",
        "max_connections",
        "queue",
        "max_header_bytes",
        "max_line_bytes",
        "max_gap",
        "idle_timeout_s",
        "line_timeout_s",
        "drain_timeout_s",
        "ort_lib",
        "arena",
        "spin",
        "memory_pattern",
        "producer_nice",
        "manifest",
        "mode",
        "batch",
        "tile",
        "threads",
        "keep_scores",
        "workers",
        "metrics",
        "node",
        "queue_max",
        "ack_timeout_s",
        "subscriber_tcp",
        "subscriber_unix",
        "outbox_min_free_mib",
        "broker",
        "client_id",
        "keep_alive_s",
        "retry_s",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start_matches(['#', ' ']).starts_with(&format!("{key} ="))),
            "the example does not document `{key}`"
        );
    }
}

#[test]
fn delivery_keys_are_checked_with_the_rest_and_name_their_key() {
    let c = load_str(&format!(
        "{MINIMAL}[delivery]\nnode = \"edge-1\"\nsubscriber_unix = \"sub.sock\"\n"
    ))
    .unwrap();
    assert_eq!(c.delivery.node, "edge-1");
    assert_eq!(
        c.delivery.subscriber,
        Some(crate::delivery::config::SubscriberAddr::Unix(
            "/etc/hsiedge/sub.sock".into()
        ))
    );
    let err = load_str(&format!("{MINIMAL}[delivery]\nqueue_max = 0\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hsiedge.toml") && err.contains("delivery.queue_max"),
        "{err}"
    );
    let err = load_str(&format!(
        "{MINIMAL}[delivery]\nsubscriber_unix = \"/run/hsiedge/control.sock\"\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("delivery.subscriber_unix"), "{err}");
    let err = load_str(&format!("{MINIMAL}[delivery.mqtt]\nbroker = \"b:1\"\nqos = 2\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("qos"), "{err}");
    // Delivery is bound at start: a reload names it as needing a restart.
    let new = load_str(&format!("{MINIMAL}[delivery]\nnode = \"other\"\n")).unwrap();
    assert_eq!(load_str(MINIMAL).unwrap().restart_only_changes(&new), vec!["delivery"]);
}

#[test]
fn defaults_fill_what_is_left_out_and_relative_paths_follow_the_file() {
    let c = load_str(MINIMAL).unwrap();
    assert_eq!(c.outbox, PathBuf::from("/etc/hsiedge/out"));
    assert_eq!(c.intake.queue, defaults::QUEUE);
    assert_eq!(c.intake.limits, Limits::default());
    assert_eq!(c.intake.drain_timeout, Duration::from_secs(60));
    let m = &c.models["tiny"];
    assert_eq!(
        (m.workers, m.session.batch.clone(), m.session.tile),
        (1, SessionBatch::ModeDefault, crate::job::DEFAULT_TILE)
    );
    assert_eq!(m.session.mode, ModeChoice::Auto);
}

#[test]
fn batch_auto_is_chosen_by_the_budget_without_a_cached_sweep() {
    let c = load_str(&MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatch = \"auto\"")).unwrap();
    match &c.models["tiny"].session.batch {
        SessionBatch::Auto(s) => assert_eq!((s.sweep_cache.as_ref(), s.adapt, s.sweep), (None, true, true)),
        other => panic!("{other:?}"),
    }
    let c = load_str(&MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatch = 4")).unwrap();
    assert_eq!(c.models["tiny"].session.batch, SessionBatch::Fixed(4));
}

#[test]
fn unknown_keys_and_wrong_types_are_refused_naming_the_key() {
    let cases = [
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatchsize = 3"),
            "batchsize",
        ),
        (MINIMAL.replace("[paths]", "[paths]\nspoolz = \"/x\""), "spoolz"),
        (MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatch = 2.5"), "batch"),
        (MINIMAL.replace("[models.tiny]", "[models.tiny]\ntile = -3"), "tile"),
        (MINIMAL.replace("[listen]", "[listen]\nudp = \"x\""), "udp"),
        (format!("{MINIMAL}\n[intake]\nqueue = true"), "queue"),
    ];
    for (text, key) in cases {
        let e = load_str(&text).unwrap_err().to_string();
        assert!(e.starts_with("/etc/hsiedge/hsiedge.toml: "), "{e}");
        assert!(e.contains(key), "{key}: {e}");
        assert!(e.contains("line "), "{key}: {e}");
    }
}

#[test]
fn values_out_of_range_are_refused_naming_the_key() {
    let cases = [
        (MINIMAL.replace("tcp = \"127.0.0.1:0\"", ""), "key `listen`"),
        (MINIMAL.replace("127.0.0.1:0", "localhost"), "key `listen.tcp`"),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatch = 0"),
            "key `models.tiny.batch`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nbatch = \"many\""),
            "key `models.tiny.batch`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nmode = \"fast\""),
            "key `models.tiny.mode`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nworkers = 0"),
            "key `models.tiny.workers`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nthreads = 100000"),
            "key `models.tiny.threads`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.tiny]\nworkers = 100000"),
            "key `models.tiny.workers`",
        ),
        (
            MINIMAL.replace("[models.tiny]", "[models.\"../x\"]"),
            "key `models.../x`",
        ),
        (
            MINIMAL.replace("state = \"/var/lib/hsiedge\"", "state = \"out/state\""),
            "key `paths.state`",
        ),
        (
            format!("{MINIMAL}[intake]\ndefault_model = \"other\""),
            "key `intake.default_model`",
        ),
        (
            format!("{MINIMAL}[intake]\nmax_line_bytes = 0"),
            "key `intake.max_line_bytes`",
        ),
        (
            format!("{MINIMAL}[intake]\nmax_header_bytes = 10"),
            "key `intake.max_header_bytes`",
        ),
        (
            format!("{MINIMAL}[intake]\ndrain_timeout_s = -1.0"),
            "key `intake.drain_timeout_s`",
        ),
        (format!("{MINIMAL}[intake]\nqueue = 0"), "key `intake.queue`"),
        (format!("{MINIMAL}[engine]\narena = \"huge\""), "key `engine.arena`"),
        (
            format!("{MINIMAL}[engine]\nproducer_nice = 20"),
            "key `engine.producer_nice`",
        ),
        (
            MINIMAL.replace("[models.tiny]\nmanifest = \"/m/tiny/manifest.json\"", ""),
            "key `models`",
        ),
    ];
    for (text, want) in cases {
        let e = load_str(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn a_reload_names_the_keys_only_a_restart_applies() {
    let a = load_str(MINIMAL).unwrap();
    let mut b = a.clone();
    b.models.get_mut("tiny").unwrap().session.batch = SessionBatch::Fixed(8);
    b.intake.segment_lines = 16;
    assert!(a.restart_only_changes(&b).is_empty());
    b.outbox = "/elsewhere".into();
    b.tcp = None;
    assert_eq!(a.restart_only_changes(&b), ["listen.tcp", "paths.outbox"]);
}

#[test]
fn metrics_is_a_loopback_address_and_a_restart_key() {
    let c = load_str(&format!("{MINIMAL}[telemetry]\nmetrics = \"127.0.0.1:9464\"\n")).unwrap();
    assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(load_str(MINIMAL).unwrap().metrics, None);
    let e = load_str(&format!("{MINIMAL}[telemetry]\nmetrics = \"0.0.0.0:9464\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("telemetry.metrics") && e.contains("not a loopback address"),
        "{e}"
    );
    let e = load_str(&format!("{MINIMAL}[telemetry]\nmetrics = \"localhost\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`localhost` is not IP:PORT"), "{e}");
    let e = load_str(&format!("{MINIMAL}[telemetry]\nport = 1\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("port"), "{e}");
    assert_eq!(
        load_str(MINIMAL).unwrap().restart_only_changes(&c),
        ["telemetry.metrics"]
    );
}

#[test]
fn engine_providers_are_read_in_order_and_a_bad_one_names_its_key() {
    let c = load_str(&format!(
        "{MINIMAL}[engine]\nep = \"tensorrt,cuda,cpu\"\ndevice_id = 1\ncudnn_conv_algo_search = \"exhaustive\"\nprecision = \"fp16\""
    ))
    .unwrap();
    let e = &c.models["tiny"].session.engine;
    assert_eq!(
        e.providers.providers(),
        &[
            crate::engine::Provider::Tensorrt,
            crate::engine::Provider::Cuda,
            crate::engine::Provider::Cpu
        ]
    );
    assert_eq!(e.gpu.device_id, 1);
    assert_eq!(e.gpu.conv_search, ConvSearch::Exhaustive);
    assert_eq!(e.precision, Precision::Fp16);
    for (key, value) in [
        ("ep", "\"cuda,rocm\""),
        ("cudnn_conv_algo_search", "\"fast\""),
        ("precision", "\"int4\""),
    ] {
        let err = load_str(&format!("{MINIMAL}[engine]\n{key} = {value}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("key `engine.{key}`")), "{err}");
    }
}
