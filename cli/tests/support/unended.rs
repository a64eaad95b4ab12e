//! A trace that reads to its footer index and trailer but holds no episode
//! end: no basecamp writer leaves one (the end is written before the
//! index), so it is made by taking the end record's frame out of a
//! finished trace, as another tool or an edit could leave it.

#![allow(dead_code)]

use basecamp_trace::format::{FRAME_HEADER_LEN, FrameHeader, PREAMBLE_LEN, TRAILER_LEN};
use basecamp_trace::pb::{EpisodeEnd, Header, PlanStep, StepKind, StepStatus, record::Body};

/// `steps` tool steps of episode `ep` (one plan step each), then the
/// footer with no episode end before it.
pub fn unended_trace(steps: u32) -> Vec<u8> {
    let bytes = tool_steps("ep", steps).finish(EpisodeEnd { outcome: 1, steps, ..Default::default() }).unwrap();
    without_end_frame(&bytes)
}

/// A trace of episode `id` (task `t`, variant `a`) being written: `steps`
/// tool steps, one plan step each, for the caller to end.
pub fn tool_steps(id: &str, steps: u32) -> basecamp_trace::TraceWriter<Vec<u8>> {
    let header = Header { episode_id: id.into(), task: "t".into(), variant: "a".into(), ..Default::default() };
    let mut w = basecamp_trace::TraceWriter::new(Vec::new(), header, 3).unwrap();
    for step in 1..=steps {
        let plan = PlanStep {
            index: step,
            kind: StepKind::ToolCall as i32,
            tool: "lookup".into(),
            status: StepStatus::Ok as i32,
            ..Default::default()
        };
        w.append(step, Body::PlanStep(Box::new(plan))).unwrap();
        w.end_step().unwrap();
    }
    w
}

/// `bytes` (a finished trace) with the frame before the index, which holds
/// the episode end, taken out and the trailer's index offset moved to match.
pub fn without_end_frame(bytes: &[u8]) -> Vec<u8> {
    let mut frames = Vec::new();
    let mut at = PREAMBLE_LEN;
    while at + TRAILER_LEN < bytes.len() {
        let h = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        frames.push(at..at + FRAME_HEADER_LEN + h.compressed_len as usize);
        at = frames.last().unwrap().end;
    }
    let end_frame = frames[frames.len() - 2].clone();
    let index_at = (frames[frames.len() - 1].start - end_frame.len()) as u64;
    let mut out = [&bytes[..end_frame.start], &bytes[end_frame.end..bytes.len() - TRAILER_LEN]].concat();
    out.extend_from_slice(&basecamp_trace::format::trailer(index_at));
    out
}
