//! The kernel's answers that callers treat as success ("already there", "already gone"), and MACs.

const ESRCH: i32 = 3;
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;

/// The errno of a netlink error reply, if it is one.
pub fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => Some(msg.raw_code().abs()),
        _ => None,
    }
}

/// The kernel says the object (link, route, address, rule, netns) is not there.
pub fn is_not_found(err: &rtnetlink::Error) -> bool {
    matches!(errno(err), Some(ENODEV | ENOENT | ESRCH))
}

/// The kernel says the object already exists.
pub fn is_exists(err: &rtnetlink::Error) -> bool {
    errno(err) == Some(EEXIST)
}

/// Formats a hardware address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (any case) into its six bytes.
pub fn parse_mac(mac: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| {
            (b.len() == 2)
                .then(|| u8::from_str_radix(b, 16).ok())
                .flatten()
        })
        .collect::<Option<_>>()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_format_and_parse() {
        let bytes = [0x02, 0xab, 0, 1, 2, 0xff];
        let s = format_mac(&bytes);
        assert_eq!(s, "02:ab:00:01:02:ff");
        assert_eq!(parse_mac(&s), Some(bytes));
        assert_eq!(parse_mac("02:AB:00:01:02:FF"), Some(bytes));
        assert_eq!(parse_mac("02:ab"), None);
        assert_eq!(parse_mac("zz:ab:00:01:02:ff"), None);
        assert_eq!(parse_mac("2:ab:00:01:02:ff:0"), None);
    }
}
