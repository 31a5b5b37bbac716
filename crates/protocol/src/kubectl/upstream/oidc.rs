//! The `oidc` kubeconfig auth-provider, sans-I/O: what client-go's
//! plugin/pkg/client/auth/oidc/oidc.go decides, given bytes and a clock
//! value. It owns the checks of the provider's config map, the id-token's
//! expiry test (the JWT payload is read, never verified), the discovery
//! document's `token_endpoint`, the refresh-token grant's request (form body
//! and `Authorization`, as golang.org/x/oauth2 v0.23 builds it) and the
//! token endpoint's answer, and the config map to persist after a refresh.
//! Error texts are client-go's and oauth2's.

pub mod redirect;

use std::collections::BTreeMap;

/// Config keys (oidc.go `cfg*` constants).
pub const ISSUER_URL: &str = "idp-issuer-url";
pub const CLIENT_ID: &str = "client-id";
pub const CLIENT_SECRET: &str = "client-secret";
pub const CA_FILE: &str = "idp-certificate-authority";
pub const CA_DATA: &str = "idp-certificate-authority-data";
pub const ID_TOKEN: &str = "id-token";
pub const REFRESH_TOKEN: &str = "refresh-token";
/// Read but unused by client-go: scopes are not sent when refreshing.
pub const EXTRA_SCOPES: &str = "extra-scopes";

/// An id-token counts as expired this long before its `exp` (oidc.go
/// `expiryDelta`).
pub const EXPIRY_DELTA_SECS: f64 = 10.0;

/// oauth2 reads at most this much of a token endpoint's answer.
pub const TOKEN_BODY_LIMIT: usize = 1 << 20;

/// A discovery answer other than 200 is quoted up to this many bytes.
const METADATA_QUOTE: usize = 80;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    /// A provider entry refused at start (client-go's words).
    #[error("{0}")]
    Config(String),
    /// The id-token could not be read.
    #[error("{0}")]
    IdToken(String),
    #[error("No valid id-token, and cannot refresh without refresh-token")]
    NoRefreshToken,
    /// Discovery failed.
    #[error("{0}")]
    Discovery(String),
    /// The token endpoint's answer was refused (oidc.go wraps it:
    /// "failed to refresh token: ...").
    #[error("failed to refresh token: {0}")]
    Refresh(String),
    #[error("token response did not contain an id_token, either the scope \"openid\" wasn't requested upon login, or the provider doesn't support id_tokens as part of the refresh response")]
    NoIdToken,
}

/// A checked provider entry (oidc.go `newOIDCAuthProvider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// `idp-certificate-authority-data`, decoded (it wins over the file).
    pub ca_data: Option<Vec<u8>>,
    pub ca_file: Option<String>,
}

impl ProviderConfig {
    /// The checks client-go makes when the provider is created.
    pub fn from_map(cfg: &BTreeMap<String, String>) -> Result<ProviderConfig, OidcError> {
        let get = |k: &str| cfg.get(k).cloned().unwrap_or_default();
        let issuer = get(ISSUER_URL);
        if issuer.is_empty() {
            return Err(OidcError::Config(format!("Must provide {ISSUER_URL}")));
        }
        let client_id = get(CLIENT_ID);
        if client_id.is_empty() {
            return Err(OidcError::Config(format!("Must provide {CLIENT_ID}")));
        }
        let data = get(CA_DATA);
        let ca_data = if data.is_empty() {
            None
        } else {
            Some(std_base64_decode(&data).map_err(OidcError::Config)?)
        };
        let file = get(CA_FILE);
        Ok(ProviderConfig {
            issuer,
            client_id,
            client_secret: get(CLIENT_SECRET),
            ca_data,
            ca_file: (!file.is_empty()).then_some(file),
        })
    }
}

/// Whether `id_token` may still be used at `now` (Unix seconds):
/// client-go's `idTokenExpired`, which (despite its name) answers "valid":
/// `now + 10s` strictly before the payload's `exp`.
pub fn id_token_valid(id_token: &str, now: f64) -> Result<bool, OidcError> {
    let parts: Vec<&str> = id_token.split('.').collect();
    if parts.len() != 3 {
        return Err(OidcError::IdToken("ID Token is not a valid JWT".into()));
    }
    let payload = raw_url_base64_decode(parts[1]).map_err(OidcError::IdToken)?;
    let exp =
        claims_exp(&payload).map_err(|e| OidcError::IdToken(format!("parsing claims: {e}")))?;
    // A missing `exp` is Go's zero time: long expired.
    Ok(exp.is_some_and(|exp| now + EXPIRY_DELTA_SECS < exp as f64))
}

/// The id-token's `exp` in Unix seconds, if it has one it can read (for
/// caching until [`id_token_valid`] turns false).
pub fn id_token_exp(id_token: &str) -> Option<i64> {
    let mut parts = id_token.split('.');
    let (_, p, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    claims_exp(&raw_url_base64_decode(p).ok()?).ok()?
}

/// Go's case-insensitive match of a JSON key to a struct field tag
/// (`encoding/json` folds ASCII case, and `ſ` to `s`, `K` (Kelvin) to `k`).
fn key_matches(key: &str, field: &str) -> bool {
    let fold = |c: char| match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    key.chars().map(fold).eq(field.chars().map(fold))
}

/// The members of a JSON object in document order (duplicates kept), as
/// Go's decoder walks them; `Ok(None)` for `null`.
fn object_members(body: &[u8]) -> Result<Option<Vec<(String, serde_json::Value)>>, String> {
    struct Members(Option<Vec<(String, serde_json::Value)>>);
    impl<'de> serde::Deserialize<'de> for Members {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Members;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_unit<E>(self) -> Result<Members, E> {
                    Ok(Members(None))
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut m: A,
                ) -> Result<Members, A::Error> {
                    let mut out = Vec::new();
                    while let Some(kv) = m.next_entry::<String, serde_json::Value>()? {
                        out.push(kv);
                    }
                    Ok(Members(Some(out)))
                }
            }
            d.deserialize_any(V)
        }
    }
    serde_json::from_slice::<Members>(body)
        .map(|m| m.0)
        .map_err(|e| e.to_string())
}

/// The `exp` claim as client-go's `jsonTime` reads it: an integer, or a
/// float truncated, given as a JSON number or a string holding one.
fn claims_exp(payload: &[u8]) -> Result<Option<i64>, String> {
    let mut exp = None;
    for (k, v) in object_members(payload)?.unwrap_or_default() {
        if key_matches(&k, "exp") {
            exp = Some(json_time(&v)?);
        }
    }
    Ok(exp)
}

fn json_time(v: &serde_json::Value) -> Result<i64, String> {
    let n = match v {
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) if serde_json::from_str::<serde_json::Number>(s).is_ok() => {
            s.clone()
        }
        serde_json::Value::String(s) => {
            return Err(format!(
                "json: invalid number literal, trying to unmarshal \"\\\"{s}\\\"\" into Number"
            ))
        }
        serde_json::Value::Null => String::new(),
        other => {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type json.Number",
                json_kind(other)
            ))
        }
    };
    if let Ok(i) = n.parse::<i64>() {
        return Ok(i);
    }
    match n.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(f as i64),
        _ => Err(format!("strconv.ParseFloat: parsing {n:?}: invalid syntax")),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "bool",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// The discovery document's URL (oidc.go `tokenEndpoint`: one trailing
/// `/` of the issuer dropped).
pub fn discovery_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.strip_suffix('/').unwrap_or(issuer)
    )
}

/// The `token_endpoint` from a discovery answer. `status` is Go's
/// `resp.Status` ("404 Not Found").
pub fn parse_discovery(code: u16, status: &str, body: &[u8]) -> Result<String, OidcError> {
    if code != 200 {
        let mut b = body.to_vec();
        if b.len() > METADATA_QUOTE {
            b.truncate(METADATA_QUOTE);
            b.extend_from_slice(b"...");
        }
        return Err(OidcError::Discovery(format!(
            "oidc: failed to query metadata endpoint {status}: {}",
            go_quote_bytes(&b)
        )));
    }
    let decode = |e: String| {
        OidcError::Discovery(format!(
            "oidc: failed to decode provider discovery object: {e}"
        ))
    };
    let mut url = String::new();
    for (k, v) in object_members(body).map_err(decode)?.unwrap_or_default() {
        if key_matches(&k, "token_endpoint") {
            match v {
                serde_json::Value::String(s) => url = s,
                serde_json::Value::Null => {}
                other => {
                    return Err(decode(format!(
                    "json: cannot unmarshal {} into Go struct field .token_endpoint of type string",
                    json_kind(&other)
                )))
                }
            }
        }
    }
    if url.is_empty() {
        return Err(OidcError::Discovery(
            "oidc: discovery object doesn't contain a token_endpoint".into(),
        ));
    }
    Ok(url)
}

/// Where oauth2 puts the client's id and secret. With `AuthStyleAutoDetect`
/// (what client-go leaves set) a fresh `oauth2.Config` is made per refresh,
/// so each refresh tries [`AuthStyle::Header`] first and, on any failure,
/// once more with [`AuthStyle::Params`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStyle {
    Header,
    Params,
}

/// A refresh-token grant, ready to POST with
/// `Content-Type: application/x-www-form-urlencoded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshRequest {
    pub body: String,
    /// The `Authorization` value (Header style).
    pub authorization: Option<String>,
}

/// oauth2's `newTokenRequest` for `grant_type=refresh_token`: the form's
/// keys sorted (`url.Values.Encode`), the id and secret query-escaped inside
/// Basic auth, or added to the form when not empty.
pub fn refresh_request(
    client_id: &str,
    client_secret: &str,
    refresh_token: &str,
    style: AuthStyle,
) -> RefreshRequest {
    let mut form: BTreeMap<&str, &str> = BTreeMap::new();
    form.insert("grant_type", "refresh_token");
    form.insert("refresh_token", refresh_token);
    let mut authorization = None;
    match style {
        AuthStyle::Params => {
            if !client_id.is_empty() {
                form.insert("client_id", client_id);
            }
            if !client_secret.is_empty() {
                form.insert("client_secret", client_secret);
            }
        }
        AuthStyle::Header => {
            let pair = format!(
                "{}:{}",
                query_escape(client_id),
                query_escape(client_secret)
            );
            authorization = Some(format!(
                "Basic {}",
                super::proxy_url::base64(pair.as_bytes())
            ));
        }
    }
    let body = form
        .iter()
        .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
        .collect::<Vec<_>>()
        .join("&");
    RefreshRequest {
        body,
        authorization,
    }
}

/// What a successful refresh gives client-go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refreshed {
    pub id_token: String,
    /// The answer's `refresh_token`, or the one sent when it had none.
    pub refresh_token: String,
}

/// The token endpoint's answer as oauth2's `doTokenRoundTrip` reads it (the
/// form or JSON body, RFC 6749 error fields, `access_token` required) and
/// then client-go (`id_token` must be a string). `status` is Go's
/// `resp.Status`; `body` is what was read (at most [`TOKEN_BODY_LIMIT`]).
pub fn parse_token_response(
    code: u16,
    status: &str,
    content_type: Option<&str>,
    body: &[u8],
    sent_refresh_token: &str,
) -> Result<Refreshed, OidcError> {
    let body = &body[..body.len().min(TOKEN_BODY_LIMIT)];
    let failure = !(200..=299).contains(&code);
    let retrieve = |err: &ErrorFields| {
        if err.code.is_empty() {
            format!(
                "oauth2: cannot fetch token: {status}\nResponse: {}",
                String::from_utf8_lossy(body)
            )
        } else {
            let mut s = format!("oauth2: {}", go_quote_bytes(err.code.as_bytes()));
            for extra in [&err.description, &err.uri] {
                if !extra.is_empty() {
                    s.push(' ');
                    s.push_str(&go_quote_bytes(extra.as_bytes()));
                }
            }
            s
        }
    };
    let refresh = |s: String| Err(OidcError::Refresh(s));
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let (fields, access_token, refresh_token, id_token) =
        if media == "application/x-www-form-urlencoded" || media == "text/plain" {
            let (vals, err) = parse_query(&String::from_utf8_lossy(body));
            if let Some(e) = err {
                if failure {
                    return refresh(retrieve(&ErrorFields::default()));
                }
                return refresh(format!("oauth2: cannot parse response: {e}"));
            }
            let get = |k: &str| {
                vals.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let fields = ErrorFields {
                code: get("error"),
                description: get("error_description"),
                uri: get("error_uri"),
            };
            // oauth2's `Token.Extra` turns digits into numbers.
            let id = get("id_token");
            let trimmed = id.trim();
            let number = match trimmed.matches('.').count() {
                0 => trimmed.parse::<i64>().is_ok(),
                1 => trimmed.parse::<f64>().is_ok() && !trimmed.contains(['i', 'I', 'n', 'N']),
                _ => false,
            };
            let has_id = vals.iter().any(|(n, _)| n == "id_token");
            let id_token = (has_id && !number).then_some(id);
            (fields, get("access_token"), get("refresh_token"), id_token)
        } else {
            match token_json(body) {
                Ok(t) => t,
                Err(e) => {
                    if failure {
                        return refresh(retrieve(&ErrorFields::default()));
                    }
                    return refresh(format!("oauth2: cannot parse json: {e}"));
                }
            }
        };
    if failure || !fields.code.is_empty() {
        return refresh(retrieve(&fields));
    }
    if access_token.is_empty() {
        return refresh("oauth2: server response missing access_token".into());
    }
    let id_token = id_token.ok_or(OidcError::NoIdToken)?;
    Ok(Refreshed {
        id_token,
        refresh_token: if refresh_token.is_empty() {
            sent_refresh_token.to_string()
        } else {
            refresh_token
        },
    })
}

#[derive(Default)]
struct ErrorFields {
    code: String,
    description: String,
    uri: String,
}

type TokenJson = (ErrorFields, String, String, Option<String>);

/// oauth2's `tokenJSON` (Go's case-insensitive field match, last member
/// wins, string fields must be strings or null) and the raw map's exact
/// `id_token` key (a string, else not there).
fn token_json(body: &[u8]) -> Result<TokenJson, String> {
    let members = object_members(body)?.unwrap_or_default();
    let mut fields = ErrorFields::default();
    let (mut access, mut refresh) = (String::new(), String::new());
    let mut id_token = None;
    let mut first_err = None;
    for (k, v) in &members {
        let slot = if key_matches(k, "access_token") {
            Some(&mut access)
        } else if key_matches(k, "refresh_token") {
            Some(&mut refresh)
        } else if key_matches(k, "error") {
            Some(&mut fields.code)
        } else if key_matches(k, "error_description") {
            Some(&mut fields.description)
        } else if key_matches(k, "error_uri") {
            Some(&mut fields.uri)
        } else if key_matches(k, "token_type") {
            None
        } else if key_matches(k, "expires_in") {
            if let Err(e) = expires_in(v) {
                first_err.get_or_insert(e);
            }
            None
        } else {
            None
        };
        match (slot, v) {
            (Some(s), serde_json::Value::String(v)) => *s = v.clone(),
            (_, serde_json::Value::Null) | (None, _) => {}
            (Some(_), other) => {
                first_err.get_or_insert(format!(
                    "json: cannot unmarshal {} into Go struct field tokenJSON.{k} of type string",
                    json_kind(other)
                ));
            }
        }
        if key_matches(k, "token_type")
            && !matches!(v, serde_json::Value::String(_) | serde_json::Value::Null)
        {
            first_err.get_or_insert(format!(
                "json: cannot unmarshal {} into Go struct field tokenJSON.token_type of type string",
                json_kind(v)
            ));
        }
        if k == "id_token" {
            id_token = match v {
                serde_json::Value::String(s) => Some(s.clone()),
                _ => None,
            };
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok((fields, access, refresh, id_token))
}

/// oauth2's `expirationTime`: null, or an integer given as a number or a
/// string holding one.
fn expires_in(v: &serde_json::Value) -> Result<(), String> {
    let n = match v {
        serde_json::Value::Null => return Ok(()),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) if serde_json::from_str::<serde_json::Number>(s).is_ok() => {
            s.clone()
        }
        other => {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type json.Number",
                json_kind(other)
            ))
        }
    };
    n.parse::<i64>()
        .map(|_| ())
        .map_err(|_| format!("strconv.ParseInt: parsing {n:?}: invalid syntax"))
}

/// The config map client-go persists after a refresh: the old one with the
/// new `id-token`, and the new `refresh-token` when the answer had another.
pub fn persisted_config(
    old: &BTreeMap<String, String>,
    refreshed: &Refreshed,
) -> BTreeMap<String, String> {
    let mut cfg = old.clone();
    let sent = old.get(REFRESH_TOKEN).map(String::as_str).unwrap_or("");
    if !refreshed.refresh_token.is_empty() && refreshed.refresh_token != sent {
        cfg.insert(REFRESH_TOKEN.into(), refreshed.refresh_token.clone());
    }
    cfg.insert(ID_TOKEN.into(), refreshed.id_token.clone());
    cfg
}

/// Go's `url.QueryEscape`.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Go's `url.ParseQuery`: pairs in order and the first error (parsing goes
/// on past a bad pair).
fn parse_query(q: &str) -> (Vec<(String, String)>, Option<String>) {
    let mut out = Vec::new();
    let mut err = None;
    for part in q.split('&') {
        if part.is_empty() {
            continue;
        }
        if part.contains(';') {
            err.get_or_insert_with(|| "invalid semicolon separator in query".to_string());
            continue;
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        match (query_unescape(k), query_unescape(v)) {
            (Ok(k), Ok(v)) => out.push((k, v)),
            (Err(e), _) | (_, Err(e)) => {
                err.get_or_insert(e);
            }
        }
    }
    (out, err)
}

fn query_unescape(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (
                    b.get(i + 1).and_then(|&c| hex(c)),
                    b.get(i + 2).and_then(|&c| hex(c)),
                ) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    _ => {
                        let end = (i + 3).min(b.len());
                        return Err(format!("invalid URL escape {}", go_quote_bytes(&b[i..end])));
                    }
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `%q` of a byte slice: printable characters as they are, the rest
/// escaped (invalid UTF-8 byte by byte as `\x..`).
pub fn go_quote_bytes(b: &[u8]) -> String {
    let mut out = String::from("\"");
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    out.push_str(&format!("\\x{:02x}", c as u32))
                }
                c if c.is_control() || c == '\u{feff}' => {
                    if (c as u32) < 0x10000 {
                        out.push_str(&format!("\\u{:04x}", c as u32))
                    } else {
                        out.push_str(&format!("\\U{:08x}", c as u32))
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out.push('"');
    out
}

fn b64_value(c: u8, url: bool) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' if !url => 62,
        b'/' if !url => 63,
        b'-' if url => 62,
        b'_' if url => 63,
        _ => return None,
    } as u32)
}

/// Go's `base64.RawURLEncoding.DecodeString` (no padding; CR and LF
/// skipped; strict trailing bits).
fn raw_url_base64_decode(s: &str) -> Result<Vec<u8>, String> {
    decode_base64(s, true)
}

/// Go's `base64.StdEncoding.DecodeString` (padding required).
pub fn std_base64_decode(s: &str) -> Result<Vec<u8>, String> {
    decode_base64(s, false)
}

fn decode_base64(s: &str, raw_url: bool) -> Result<Vec<u8>, String> {
    let illegal = |at: usize| Err(format!("illegal base64 data at input byte {at}"));
    let src = s.as_bytes();
    let skip_newlines = |mut i: usize| {
        while i < src.len() && (src[i] == b'\n' || src[i] == b'\r') {
            i += 1;
        }
        i
    };
    let mut out = Vec::with_capacity(src.len() * 3 / 4);
    let mut si = 0;
    // One quantum of up to four symbols per turn, as Go's `decodeQuantum`.
    loop {
        let mut dbuf = [0u32; 4];
        let mut dlen = 4;
        let mut end = false;
        let mut j = 0;
        while j < 4 {
            if si == src.len() {
                if j == 0 {
                    return Ok(out);
                }
                if j == 1 || !raw_url {
                    return illegal(si - j);
                }
                dlen = j;
                end = true;
                break;
            }
            let c = src[si];
            si += 1;
            if let Some(v) = b64_value(c, raw_url) {
                dbuf[j] = v;
                j += 1;
                continue;
            }
            if c == b'\n' || c == b'\r' {
                continue;
            }
            if c != b'=' || raw_url {
                return illegal(si - 1);
            }
            // Padding.
            if j < 2 {
                return illegal(si - 1);
            }
            if j == 2 {
                si = skip_newlines(si);
                if si == src.len() {
                    return illegal(src.len());
                }
                if src[si] != b'=' {
                    return illegal(si - 1);
                }
                si += 1;
            }
            si = skip_newlines(si);
            if si < src.len() {
                return illegal(si);
            }
            dlen = j;
            end = true;
            break;
        }
        let v = dbuf[0] << 18 | dbuf[1] << 12 | dbuf[2] << 6 | dbuf[3];
        let bytes = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        out.extend_from_slice(&bytes[..dlen - 1]);
        if end {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64url(s: &str) -> String {
        super::super::proxy_url::base64(s.as_bytes())
            .trim_end_matches('=')
            .replace('+', "-")
            .replace('/', "_")
    }

    fn jwt(payload: &str) -> String {
        format!("{}.{}.sig", b64url("{\"alg\":\"none\"}"), b64url(payload))
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn config_checks_in_client_go_order() {
        let e = ProviderConfig::from_map(&map(&[(CLIENT_ID, "c")])).unwrap_err();
        assert_eq!(e.to_string(), "Must provide idp-issuer-url");
        let e = ProviderConfig::from_map(&map(&[(ISSUER_URL, "https://i")])).unwrap_err();
        assert_eq!(e.to_string(), "Must provide client-id");
        let e = ProviderConfig::from_map(&map(&[
            (ISSUER_URL, "https://i"),
            (CLIENT_ID, "c"),
            (CA_DATA, "!!"),
        ]))
        .unwrap_err();
        assert_eq!(e.to_string(), "illegal base64 data at input byte 0");
        let c = ProviderConfig::from_map(&map(&[
            (ISSUER_URL, "http://i"),
            (CLIENT_ID, "c"),
            (CA_DATA, "YWJj"),
            (CA_FILE, "/ca"),
        ]))
        .unwrap();
        assert_eq!(c.ca_data.as_deref(), Some(&b"abc"[..]));
        assert_eq!(c.ca_file.as_deref(), Some("/ca"));
        assert_eq!(c.client_secret, "");
    }

    #[test]
    fn expiry_with_ten_second_leeway() {
        let t = jwt("{\"exp\":1000}");
        assert!(id_token_valid(&t, 989.0).unwrap());
        assert!(!id_token_valid(&t, 990.0).unwrap());
        assert_eq!(id_token_exp(&t), Some(1000));
        // Floats truncated, numeric strings accepted, keys case-folded,
        // the last member wins.
        assert!(id_token_valid(&jwt("{\"exp\":1000.9}"), 989.5).unwrap());
        assert!(!id_token_valid(&jwt("{\"exp\":1000.9}"), 990.0).unwrap());
        assert!(id_token_valid(&jwt("{\"exp\":\"2000\"}"), 0.0).unwrap());
        assert!(id_token_valid(&jwt("{\"EXP\":2000}"), 0.0).unwrap());
        assert!(!id_token_valid(&jwt("{\"exp\":2000,\"Exp\":1}"), 0.0).unwrap());
        // No exp: Go's zero time, expired.
        assert!(!id_token_valid(&jwt("{\"sub\":\"x\"}"), 0.0).unwrap());
        assert!(!id_token_valid(&jwt("null"), 0.0).unwrap());
    }

    #[test]
    fn unreadable_id_tokens() {
        for (t, want) in [
            ("abc", "ID Token is not a valid JWT".to_string()),
            ("a.b.c.d", "ID Token is not a valid JWT".into()),
            ("a.!.c", "illegal base64 data at input byte 0".into()),
            // Raw encoding: padding is illegal.
            (
                &format!("a.{}=.c", b64url("{}")),
                "illegal base64 data at input byte 3".into(),
            ),
        ] {
            assert_eq!(id_token_valid(t, 0.0).unwrap_err().to_string(), want, "{t}");
        }
        let e = id_token_valid(&jwt("{\"exp\":true}"), 0.0).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("parsing claims: json: cannot unmarshal bool"),
            "{e}"
        );
        let e = id_token_valid(&jwt("{\"exp\":null}"), 0.0).unwrap_err();
        assert!(e.to_string().contains("parsing \"\""), "{e}");
        assert!(id_token_valid(&jwt("[1]"), 0.0).is_err());
    }

    #[test]
    fn discovery() {
        assert_eq!(
            discovery_url("https://i/x//"),
            "https://i/x//.well-known/openid-configuration"
        );
        assert_eq!(
            discovery_url("https://i"),
            "https://i/.well-known/openid-configuration"
        );
        assert_eq!(
            parse_discovery(
                200,
                "200 OK",
                br#"{"issuer":"i","token_endpoint":"https://t/tok"}"#
            )
            .unwrap(),
            "https://t/tok"
        );
        assert_eq!(
            parse_discovery(200, "200 OK", b"{}")
                .unwrap_err()
                .to_string(),
            "oidc: discovery object doesn't contain a token_endpoint"
        );
        let long = "x".repeat(100);
        assert_eq!(
            parse_discovery(404, "404 Not Found", long.as_bytes())
                .unwrap_err()
                .to_string(),
            format!(
                "oidc: failed to query metadata endpoint 404 Not Found: \"{}...\"",
                "x".repeat(80)
            )
        );
        let e = parse_discovery(200, "200 OK", b"<html>").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("oidc: failed to decode provider discovery object: "));
        let e = parse_discovery(200, "200 OK", br#"{"token_endpoint":1}"#).unwrap_err();
        assert!(e.to_string().contains("cannot unmarshal number"), "{e}");
    }

    #[test]
    fn refresh_request_shapes() {
        let r = refresh_request("my client", "s&c", "r t", AuthStyle::Header);
        assert_eq!(r.body, "grant_type=refresh_token&refresh_token=r+t");
        // base64("my+client:s%26c")
        assert_eq!(
            r.authorization.as_deref(),
            Some("Basic bXkrY2xpZW50OnMlMjZj")
        );
        let r = refresh_request("id", "", "rt", AuthStyle::Params);
        assert_eq!(
            r.body,
            "client_id=id&grant_type=refresh_token&refresh_token=rt"
        );
        assert_eq!(r.authorization, None);
        let r = refresh_request("id", "sec", "rt", AuthStyle::Params);
        assert_eq!(
            r.body,
            "client_id=id&client_secret=sec&grant_type=refresh_token&refresh_token=rt"
        );
    }

    #[test]
    fn token_answers() {
        let ok = |ct: Option<&str>, body: &str| {
            parse_token_response(200, "200 OK", ct, body.as_bytes(), "old")
        };
        let r = ok(
            Some("application/json"),
            r#"{"access_token":"a","id_token":"new","refresh_token":"r2","expires_in":"3600"}"#,
        )
        .unwrap();
        assert_eq!(
            (r.id_token.as_str(), r.refresh_token.as_str()),
            ("new", "r2")
        );
        let r = ok(None, r#"{"access_token":"a","id_token":"new"}"#).unwrap();
        assert_eq!(r.refresh_token, "old");
        let r = ok(
            Some("application/x-www-form-urlencoded; charset=utf-8"),
            "access_token=a&id_token=n+1&refresh_token=r%2F2",
        )
        .unwrap();
        assert_eq!(
            (r.id_token.as_str(), r.refresh_token.as_str()),
            ("n 1", "r/2")
        );
        assert_eq!(
            ok(None, r#"{"id_token":"x"}"#).unwrap_err().to_string(),
            "failed to refresh token: oauth2: server response missing access_token"
        );
        assert_eq!(
            ok(None, r#"{"access_token":"a"}"#).unwrap_err(),
            OidcError::NoIdToken
        );
        assert_eq!(
            ok(None, r#"{"access_token":"a","id_token":5}"#).unwrap_err(),
            OidcError::NoIdToken
        );
        assert_eq!(
            ok(Some("text/plain"), "access_token=a&id_token=12").unwrap_err(),
            OidcError::NoIdToken
        );
        assert_eq!(
            parse_token_response(
                400,
                "400 Bad Request",
                Some("application/json"),
                br#"{"error":"invalid_grant","error_description":"expired"}"#,
                "o"
            )
            .unwrap_err()
            .to_string(),
            "failed to refresh token: oauth2: \"invalid_grant\" \"expired\""
        );
        assert_eq!(
            parse_token_response(500, "500 Internal Server Error", None, b"boom", "o")
                .unwrap_err()
                .to_string(),
            "failed to refresh token: oauth2: cannot fetch token: 500 Internal Server Error\nResponse: boom"
        );
        // An error code in a 200 answer fails too.
        assert!(ok(None, r#"{"access_token":"a","id_token":"i","error":"x"}"#).is_err());
        let e = ok(None, "nope").unwrap_err().to_string();
        assert!(
            e.starts_with("failed to refresh token: oauth2: cannot parse json: "),
            "{e}"
        );
        let e = ok(None, r#"{"access_token":1}"#).unwrap_err().to_string();
        assert!(e.contains("cannot unmarshal number"), "{e}");
        let e = ok(
            None,
            r#"{"access_token":"a","id_token":"i","expires_in":1.5}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ParseInt"), "{e}");
        let e = ok(Some("text/plain"), "a=%zz").unwrap_err().to_string();
        assert_eq!(
            e,
            "failed to refresh token: oauth2: cannot parse response: invalid URL escape \"%zz\""
        );
    }

    #[test]
    fn persisted_map() {
        let old = map(&[(ID_TOKEN, "i1"), (REFRESH_TOKEN, "r1"), (CLIENT_ID, "c")]);
        let same = persisted_config(
            &old,
            &Refreshed {
                id_token: "i2".into(),
                refresh_token: "r1".into(),
            },
        );
        assert_eq!(
            same,
            map(&[(ID_TOKEN, "i2"), (REFRESH_TOKEN, "r1"), (CLIENT_ID, "c")])
        );
        let new = persisted_config(
            &old,
            &Refreshed {
                id_token: "i2".into(),
                refresh_token: "r2".into(),
            },
        );
        assert_eq!(new[REFRESH_TOKEN], "r2");
    }

    #[test]
    fn std_base64() {
        assert_eq!(std_base64_decode("YWJjZA==").unwrap(), b"abcd");
        assert_eq!(std_base64_decode("YWJj\nZA==").unwrap(), b"abcd");
        assert_eq!(
            std_base64_decode("YWJjZA").unwrap_err(),
            "illegal base64 data at input byte 4"
        );
        assert_eq!(
            std_base64_decode("!!").unwrap_err(),
            "illegal base64 data at input byte 0"
        );
        assert!(std_base64_decode("YWJjZA=").is_err());
        assert!(std_base64_decode("YW=jZA==").is_err());
        assert_eq!(raw_url_base64_decode("YWJjZA").unwrap(), b"abcd");
        assert_eq!(raw_url_base64_decode("_-8").unwrap(), [0xff, 0xef]);
        assert!(raw_url_base64_decode("Y").is_err());
    }

    #[test]
    fn go_quote() {
        assert_eq!(
            go_quote_bytes(b"a\"b\\\n\x01\xff\xc3\xa9"),
            "\"a\\\"b\\\\\\n\\x01\\xff\u{e9}\""
        );
    }
}
