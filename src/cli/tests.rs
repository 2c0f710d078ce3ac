use super::*;

#[test]
fn durations_parse() {
    assert_eq!(
        parse_duration("30s"),
        Ok(std::time::Duration::from_secs(30))
    );
    assert_eq!(
        parse_duration("30m"),
        Ok(std::time::Duration::from_secs(1800))
    );
    assert_eq!(
        parse_duration("250ms"),
        Ok(std::time::Duration::from_millis(250))
    );
    assert_eq!(parse_duration("7"), Ok(std::time::Duration::from_secs(7)));
    assert_eq!(
        parse_duration("1h30m"),
        Ok(std::time::Duration::from_secs(5400))
    );
    assert_eq!(
        parse_duration("PT2M"),
        Ok(std::time::Duration::from_secs(120))
    );
    assert!(parse_duration("x").is_err());
    assert!(parse_duration("5 fortnights").is_err());
    let negative = parse_duration("-5s").expect_err("negative");
    assert!(negative.contains("negative"), "{negative}");
}

#[test]
fn a_restore_takes_exactly_one_source_and_says_which_there_are() {
    use clap::Parser;
    let parse = |extra: &[&str]| {
        let mut args = vec!["captf", "state", "restore", "tfm/web-1"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)
    };
    let none = parse(&[]).expect_err("no source").to_string();
    assert!(
        none.contains("--from-backup|--from-file <FROM_FILE>|--from-errored <SECRET>"),
        "{none}"
    );
    let two = parse(&["--from-backup", "--from-errored", "x"])
        .expect_err("two sources")
        .to_string();
    assert!(two.contains("cannot be used with"), "{two}");
    for one in [
        &["--from-backup"][..],
        &["--from-file", "state.json"],
        &[
            "--from-errored",
            "tfstate-default-errored-1-ab1cd.web-1.tfm",
        ],
    ] {
        assert!(parse(one).is_ok(), "{one:?}");
    }
}
