//! The per-stream workspace of the kernels that finish in their last CTA (`moe.cuh`
//! `last_block_done` and `grid_histogram`: `aux_fi`, `group_count`, the count-and-scan launch of
//! `get_fused_mapping`): zero-filled u32 words that every such kernel leaves all zero when it
//! ends, so the next launch on the same stream reuses them without a memset (graph-safe).
//!
//! One workspace per stream (launches on one stream are ordered, so they never share it at the
//! same time). It is created (a stream-ordered zero fill) the first time a stream needs it, and
//! replaced by a larger one when a call needs more words: do either before capturing a CUDA
//! graph ([`crate::prewarm`] prepares [`MIN_WORDS`] words on the handle's stream). A captured
//! graph uses its capturing stream's workspace: do not replay it concurrently with itself or
//! with these ops on that stream. Workspaces of streams nobody else holds any more are freed
//! when a new one is made.

use std::sync::{Arc, Mutex};

use tk_core::{Device, DeviceTensor, Result};

/// The smallest workspace (words): a ticket and the counters of up to 4095 bins, or the
/// packed 64-bit arrival words of up to 256 bins (`group_count::count`).
pub(crate) const MIN_WORDS: usize = 4096;

/// One stream's workspace.
struct Workspace {
    /// The stream (`Arc` pointer) it belongs to.
    stream: usize,
    /// `(words,)` 32-bit words (the kernels read them as u32), zero between kernels.
    words: DeviceTensor<i32>,
    /// How many references to the stream `words` itself holds (the stream is otherwise unused
    /// when its strong count falls to this).
    own_refs: usize,
}

static WORKSPACES: Mutex<Vec<Workspace>> = Mutex::new(Vec::new());

/// The device address of at least `words` zeroed u32 words private to `dev`'s stream, which
/// every kernel given them must leave zeroed (see the module docs).
pub(crate) fn zeroed_words(dev: &Device, words: usize) -> Result<u64> {
    let stream = Arc::as_ptr(dev.stream()) as usize;
    let mut pool = WORKSPACES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(w) = pool
        .iter()
        .find(|w| w.stream == stream && w.words.shape()[0] >= words)
    {
        return Ok(w.words.view().address());
    }
    // A new (or larger) workspace: drop this stream's smaller one (a stream-ordered free, after
    // the kernels using it) and those of streams nobody else holds.
    pool.retain(|w| {
        w.stream != stream && Arc::strong_count(w.words.device().stream()) > w.own_refs
    });
    let before = Arc::strong_count(dev.stream());
    let zeros = dev.zeros::<i32>(&[words.max(MIN_WORDS).next_power_of_two()])?;
    let own_refs = Arc::strong_count(dev.stream()) - before;
    let address = zeros.view().address();
    pool.push(Workspace {
        stream,
        words: zeros,
        own_refs,
    });
    Ok(address)
}
