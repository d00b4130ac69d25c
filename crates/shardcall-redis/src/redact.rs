//! Redis URLs as they may be shown: a password never reaches a message,
//! a log line or any other output.

/// `url` with its password (and a user-info part that may be one) hidden:
/// `redis://user:secret@host:6379/` becomes `redis://user:***@host:6379/`,
/// `redis://secret@host/` becomes `redis://***@host/`. Text that is not a
/// URL is returned unchanged unless it holds an `@`, which is hidden too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let path = redact_query(path);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return format!("{scheme}://{authority}{path}");
    };
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{scheme}://{shown}@{host}{path}")
}

/// A `password=` query parameter's value hidden.
fn redact_query(path: &str) -> String {
    let Some((before, query)) = path.split_once('?') else {
        return path.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{before}?{}", params.join("&"))
}

/// Every URL of `urls`, redacted, comma separated.
pub fn redact_urls(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact_url(u))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        for (url, shown) in [
            ("redis://u:s3cret@h:1/", "redis://u:***@h:1/"),
            ("rediss://:s3cret@h:1/0", "rediss://:***@h:1/0"),
            ("redis://s3cret@h/", "redis://***@h/"),
            ("redis://u:p@ss:w@rd@h:1/", "redis://u:***@h:1/"),
            ("redis://h:1/", "redis://h:1/"),
            (
                "redis://h:1/?password=x&db=2",
                "redis://h:1/?password=***&db=2",
            ),
            ("s3cret@h", "***@h"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
