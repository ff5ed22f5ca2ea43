//! EC2 Query API parameters: `Action=...&Version=...&Filter.1.Name=...&Filter.1.Value.1=...`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::error::{Ec2Error, Ec2Result};
use crate::world::Filter;

/// The decoded form parameters of one request (or of one member of a list of structures).
#[derive(Clone, Debug, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    /// Decodes a form-encoded body. Repeated keys keep the last value, as EC2 does.
    pub fn parse(body: &[u8]) -> Ec2Result<Self> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).map_err(|e| {
            Ec2Error::client(
                "MalformedQueryString",
                format!("The request body is not a valid form: {e}"),
            )
        })?;
        Ok(Self(pairs.into_iter().collect()))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Every parameter's name.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// A required parameter.
    pub fn req(&self, key: &str) -> Ec2Result<&str> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(Ec2Error::missing(key)),
        }
    }

    /// An optional parameter parsed as `T`, with EC2's error for a bad value.
    pub fn parsed<T: FromStr>(&self, key: &str, what: &str) -> Ec2Result<Option<T>> {
        self.get(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| Ec2Error::invalid_value(key, v, &format!("Expected {what}.")))
            })
            .transpose()
    }

    pub fn u32(&self, key: &str) -> Ec2Result<Option<u32>> {
        self.parsed(key, "a non-negative integer")
    }

    pub fn bool(&self, key: &str) -> Ec2Result<Option<bool>> {
        self.parsed(key, "true or false")
    }

    pub fn ip(&self, key: &str) -> Ec2Result<Option<Ipv4Addr>> {
        self.parsed(key, "an IPv4 address")
    }

    /// Indexes N present as `prefix.N` or `prefix.N.*`, in numeric order.
    fn indexes(&self, prefix: &str) -> Vec<u32> {
        let dot = format!("{prefix}.");
        let mut idx: Vec<u32> = self
            .0
            .keys()
            .filter_map(|k| k.strip_prefix(&dot))
            .filter_map(|rest| rest.split('.').next()?.parse().ok())
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    /// A flattened list of scalars: `prefix.1`, `prefix.2`, ...
    pub fn list(&self, prefix: &str) -> Vec<String> {
        self.indexes(prefix)
            .into_iter()
            .filter_map(|i| self.get(&format!("{prefix}.{i}")).map(str::to_owned))
            .collect()
    }

    /// A flattened list of structures: `prefix.1.Field`, ... each returned as its own Params.
    pub fn structs(&self, prefix: &str) -> Vec<Params> {
        self.indexes(prefix)
            .into_iter()
            .map(|i| {
                let p = format!("{prefix}.{i}.");
                Params(
                    self.0
                        .iter()
                        .filter_map(|(k, v)| k.strip_prefix(&p).map(|r| (r.to_owned(), v.clone())))
                        .collect(),
                )
            })
            .collect()
    }

    /// The sub-structure `prefix.Field` as Params.
    pub fn member(&self, prefix: &str) -> Option<Params> {
        let p = format!("{prefix}.");
        let m: BTreeMap<String, String> = self
            .0
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&p).map(|r| (r.to_owned(), v.clone())))
            .collect();
        (!m.is_empty()).then_some(Params(m))
    }

    /// `Filter.N.Name` + `Filter.N.Value.M`.
    pub fn filters(&self) -> Ec2Result<Vec<Filter>> {
        self.structs("Filter")
            .into_iter()
            .map(|f| {
                let name = f
                    .req("Name")
                    .map_err(|_| Ec2Error::missing("Filter.N.Name"))?
                    .to_owned();
                let values = f.list("Value");
                if values.is_empty() {
                    return Err(Ec2Error::invalid_value(
                        "Filter",
                        &name,
                        "The filter must have at least one value.",
                    ));
                }
                Ok(Filter { name, values })
            })
            .collect()
    }

    /// `Tag.N.Key` / `Tag.N.Value` pairs under `prefix`.
    pub fn tags(&self, prefix: &str) -> Ec2Result<Vec<(String, Option<String>)>> {
        self.structs(prefix)
            .into_iter()
            .map(|t| Ok((t.req("Key")?.to_owned(), t.get("Value").map(str::to_owned))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_structures() {
        let p = Params::parse(
            b"Action=X&Filter.2.Name=b&Filter.2.Value.1=z&Filter.1.Name=a&Filter.1.Value.1=x&Filter.1.Value.10=y&Id.2=q&Id.1=p",
        )
        .unwrap();
        assert_eq!(p.list("Id"), vec!["p", "q"]);
        let f = p.filters().unwrap();
        assert_eq!(f[0].name, "a");
        assert_eq!(f[0].values, vec!["x", "y"]);
        assert_eq!(f[1].name, "b");
        assert!(
            Params::parse(b"Filter.1.Name=a")
                .unwrap()
                .filters()
                .is_err()
        );
        assert_eq!(p.req("Nope").unwrap_err().code, "MissingParameter");
    }
}
