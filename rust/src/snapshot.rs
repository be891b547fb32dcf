//! The answers Python prepared for the hot RPCs, swapped in whole by Python after every change
//! of state. A call is answered from here only when the snapshot holds its exact answer;
//! anything else is a miss and goes to Python.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;
use bytes::Bytes;

use crate::answer::Answer;
use crate::wire;

/// NodeGroupForNode's index: providerID (as the engine spells it) -> framed answer.
#[derive(Default)]
pub struct NodeIndex {
    pub by_provider_id: HashMap<String, Bytes>,
    pub not_managed: Bytes,
}

/// Per-method answers keyed by group id ("" for the argumentless RPCs).
pub type Table = HashMap<String, Answer>;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hot {
    NodeGroups,
    ForNode,
    GpuLabel,
    TargetSize,
    GetOptions,
    Template,
}

impl Hot {
    pub fn from_method(name: &str) -> Option<Hot> {
        Some(match name {
            "NodeGroups" => Hot::NodeGroups,
            "NodeGroupForNode" => Hot::ForNode,
            "GPULabel" => Hot::GpuLabel,
            "NodeGroupTargetSize" => Hot::TargetSize,
            "NodeGroupGetOptions" => Hot::GetOptions,
            "NodeGroupTemplateNodeInfo" => Hot::Template,
            _ => return None,
        })
    }

    fn slot(self) -> usize {
        self as usize
    }
}

const TABLES: usize = 6;
/// Distinct requests remembered per RPC before the memo starts over (CA sends one set of
/// GetOptions defaults per CA version, so a handful per group in practice).
const MEMO_LIMIT: usize = 1024;
/// Larger requests are not remembered: CA's are a few hundred bytes, and the memo must not
/// hold MEMO_LIMIT requests of up to 16 MiB each for whoever sends them.
const MEMO_REQUEST_LIMIT: usize = 4096;

/// Each part swaps on its own, so publishing the targets does not copy the node index.
pub struct Snapshot {
    index: ArcSwap<Option<NodeIndex>>,
    tables: [ArcSwap<Table>; TABLES],
    /// RPCs whose OK answers Python declared a pure function of the request bytes.
    memoized: [AtomicBool; TABLES],
    memo: [RwLock<HashMap<Bytes, Answer>>; TABLES],
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            index: ArcSwap::from_pointee(None),
            tables: std::array::from_fn(|_| ArcSwap::from_pointee(Table::new())),
            memoized: std::array::from_fn(|_| AtomicBool::new(false)),
            memo: std::array::from_fn(|_| RwLock::new(HashMap::new())),
        }
    }
}

impl Snapshot {
    pub fn set_index(&self, index: NodeIndex) {
        self.index.store(Arc::new(Some(index)));
    }

    pub fn set_table(&self, hot: Hot, table: Table) {
        self.tables[hot.slot()].store(Arc::new(table));
    }

    /// Nothing prepared for `hot` any more: every call of it goes to Python.
    pub fn withdraw(&self, hot: Hot) {
        match hot {
            Hot::ForNode => self.index.store(Arc::new(None)),
            _ => self.tables[hot.slot()].store(Arc::new(Table::new())),
        }
        if let Ok(mut memo) = self.memo[hot.slot()].write() {
            memo.clear();
        }
    }

    pub fn set_memoized(&self, hot: Hot) {
        self.memoized[hot.slot()].store(true, Relaxed);
    }

    /// The prepared answer to `request`, or None (a miss: Python answers).
    pub fn answer(&self, hot: Hot, request: &Bytes) -> Option<Answer> {
        let key = match hot {
            Hot::ForNode => return self.for_node(wire::provider_id(request)?),
            Hot::NodeGroups | Hot::GpuLabel => wire::empty(request).map(|()| "")?,
            Hot::TargetSize | Hot::Template => wire::group_id(request)?,
            Hot::GetOptions => wire::options_group_id(request)?,
        };
        if let Some(answer) = self.tables[hot.slot()].load().get(key) {
            return Some(answer.clone());
        }
        if !self.memoized[hot.slot()].load(Relaxed) {
            return None;
        }
        let memo = self.memo[hot.slot()].read().ok()?;
        memo.get(request).cloned()
    }

    /// Keeps Python's OK answer to `request` if the RPC is memoized.
    pub fn remember(&self, hot: Hot, request: Bytes, answer: &Answer) {
        if !self.memoized[hot.slot()].load(Relaxed)
            || !matches!(answer, Answer::Ok(_))
            || request.len() > MEMO_REQUEST_LIMIT
        {
            return;
        }
        if let Ok(mut memo) = self.memo[hot.slot()].write() {
            if memo.len() >= MEMO_LIMIT {
                memo.clear();
            }
            memo.insert(request, answer.clone());
        }
    }

    /// The exact spelling first, then the canonical one (engine/providerid.py's rules).
    fn for_node(&self, provider_id: &str) -> Option<Answer> {
        let guard = self.index.load();
        let index = guard.as_ref().as_ref()?;
        let hit = index.by_provider_id.get(provider_id).or_else(|| {
            let canonical = canonical_provider_id(provider_id)?;
            index.by_provider_id.get(&canonical)
        });
        Some(Answer::Ok(hit.unwrap_or(&index.not_managed).clone()))
    }
}

const PREFIX: &str = "cloudscale://";

/// `cloudscale://<uuid>` with the prefix in any case and the uuid in any case, with or without
/// hyphens, spelled as the cloud controller manager writes it; None if it names no uuid.
pub fn canonical_provider_id(provider_id: &str) -> Option<String> {
    let head = provider_id.get(..PREFIX.len())?;
    if provider_id.len() <= PREFIX.len() || !head.eq_ignore_ascii_case(PREFIX) {
        return None;
    }
    let rest = &provider_id.as_bytes()[PREFIX.len()..];
    let digits: Vec<u8> = match rest.len() {
        36 if [8, 13, 18, 23].iter().all(|&i| rest[i] == b'-') => {
            rest.iter().copied().filter(|&b| b != b'-').collect()
        }
        32 => rest.to_vec(),
        _ => return None,
    };
    if digits.len() != 32 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let hex = String::from_utf8(digits).ok()?.to_ascii_lowercase();
    Some(format!(
        "{PREFIX}{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

#[cfg(test)]
mod tests {
    use super::canonical_provider_id as canonical;

    #[test]
    fn provider_id_spellings() {
        let ccm = "cloudscale://0a1b2c3d-0000-4000-8000-00000000abcd";
        assert_eq!(canonical(ccm).as_deref(), Some(ccm));
        assert_eq!(
            canonical("CloudScale://0A1B2C3D00004000800000000000ABCD").as_deref(),
            Some(ccm)
        );
        assert_eq!(
            canonical("cloudscale://0a1b2c3d-0000-4000-8000-00000000abc"),
            None
        );
        assert_eq!(
            canonical("cloudscale://0a1b2c3d+0000-4000-8000-00000000abcd"),
            None
        );
        assert_eq!(
            canonical("cloudscale://0a1b2c3d-0000-4000-8000-00000000abcg"),
            None
        );
        assert_eq!(canonical("aws:///eu-west-1a/i-0123"), None);
        assert_eq!(canonical("cloudscale://"), None);
        assert_eq!(canonical(""), None);
    }
}
