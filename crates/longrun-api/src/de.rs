//! Readers the request bodies share, for `#[serde(deserialize_with)]`.

use serde::Deserialize;
use serde_json::Value;

/// A whole number of seconds, also when a client's JSON encoder writes it
/// as `326.0` (JSON Schema's `integer` admits that spelling).
pub fn whole_number<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<Value>::deserialize(deserializer)?
        .map(|v| as_whole_number(&v).ok_or_else(|| serde::de::Error::custom("expected a whole number of seconds")))
        .transpose()
}

/// A required whole number (of bytes, say), also when written as `326.0`.
pub fn required_whole_number<'de, D>(deserializer: D) -> Result<u64, D::Error>
where
    D: serde::Deserializer<'de>,
{
    as_whole_number(&Value::deserialize(deserializer)?)
        .ok_or_else(|| serde::de::Error::custom("expected a whole number"))
}

/// Tells "present but null" (`Some(None)`) from "absent" (`None`, with
/// `#[serde(default)]`) for a whole number.
pub fn present_whole_number<'de, D>(deserializer: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    whole_number(deserializer).map(Some)
}

/// A nested body field that must be a JSON object (or `null`/absent): serde's
/// derived structs would also take an array in field order, which the
/// document does not allow. Read in one pass (no intermediate `Value`): the
/// field's own struct is fed the map directly, and anything but a map is
/// refused.
pub fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_option(Nullable(std::marker::PhantomData))
}

/// [`object`] for a required field.
pub fn required_object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_map(OnlyMap(std::marker::PhantomData))
}

struct OnlyMap<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for OnlyMap<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

struct Nullable<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Nullable<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object or null")
    }

    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        required_object(deserializer).map(Some)
    }
}

/// Within int64, the format the document states.
fn as_whole_number(value: &Value) -> Option<u64> {
    let whole = match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < i64::MAX as f64)
                .map(|f| f as u64)
        }),
        _ => None,
    };
    whole.filter(|w| i64::try_from(*w).is_ok())
}

/// A field whose `null` means something (`Some(None)`) beside its absence
/// (`None`, with `#[serde(default)]`).
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}
