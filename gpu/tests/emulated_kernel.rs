//! The CUDA kernels' logic, run on the CPU: `gpu/bench/emulate/` compiles
//! `src/cuda/logits.cu` as C++ with one thread per CUDA thread and barriers
//! for `__syncthreads` and the warp shuffles. When `BASECAMP_CUDA_EMULATOR`
//! names that binary (`gpu/bench/emulate/run.sh` builds it and runs this), the
//! kernels are held to the float64 oracle exactly as on a GPU: every row
//! shape, both dtypes, mixed pairs, misaligned rows, poisoned outputs.
//! Otherwise each test prints a skip line. It checks indexing, alignment,
//! reductions and the top-k merge, not speed or hardware races.

use std::path::{Path, PathBuf};
use std::process::Command;

use basecamp_gpu::logits::reference::reference;
use basecamp_gpu::logits::{LogitStats, LogitsView, bf16};
use basecamp_gpu::testdata::{
    Rng, deviation, far_jump_rows, fresh_seed, mixed_logits, perturbed, shifted_kl_close, shifted_q_rows, to_bf16,
};

const LIMIT: f64 = 1e-4;
const KL_FLOOR: f64 = 1e-6;

fn emulator() -> Option<PathBuf> {
    match std::env::var_os("BASECAMP_CUDA_EMULATOR") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            println!("skipping: BASECAMP_CUDA_EMULATOR is not set (gpu/bench/emulate/run.sh sets it)");
            None
        }
    }
}

fn raw_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn raw_bf16(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

fn words<T>(bytes: &[u8], n: usize, at: &mut usize, f: impl Fn([u8; 4]) -> T) -> Vec<T> {
    let out = bytes[*at..*at + 4 * n].chunks_exact(4).map(|c| f([c[0], c[1], c[2], c[3]])).collect();
    *at += 4 * n;
    out
}

#[allow(clippy::too_many_arguments)]
fn run(
    emu: &Path,
    dir: &Path,
    p: &[f32],
    q: Option<&[f32]>,
    bf: (bool, bool),
    rows: usize,
    vocab: usize,
    k: usize,
) -> LogitStats {
    let (p16, q16) = (to_bf16(p), q.map(to_bf16));
    let write = |name: &str, bytes: Vec<u8>| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write input");
        path
    };
    let p_path = write("p.bin", if bf.0 { raw_bf16(&p16) } else { raw_f32(p) });
    let q_path =
        q.map(|q| write("q.bin", if bf.1 { raw_bf16(q16.as_deref().unwrap_or_default()) } else { raw_f32(q) }));
    let out_path = dir.join("out.bin");
    let dtype = |b: bool| if b { "bf16" } else { "f32" };
    let status = Command::new(emu)
        .arg(&p_path)
        .arg(dtype(bf.0))
        .arg(q_path.as_deref().map_or(Path::new("-"), |p| p))
        .arg(dtype(bf.1))
        .args([rows.to_string(), vocab.to_string(), k.to_string()])
        .arg(&out_path)
        .status()
        .expect("the emulator runs");
    assert!(status.success(), "emulator failed: {status}");
    let bytes = std::fs::read(&out_path).expect("emulator output");
    let mut at = 0;
    let lse = words(&bytes, rows, &mut at, f32::from_le_bytes);
    let entropy = words(&bytes, rows, &mut at, f32::from_le_bytes);
    let kl = words(&bytes, rows, &mut at, f32::from_le_bytes);
    let codes = words(&bytes, rows, &mut at, i32::from_le_bytes);
    let count = words(&bytes, rows, &mut at, i32::from_le_bytes);
    let ids = words(&bytes, rows * k, &mut at, i32::from_le_bytes);
    let logprobs = words(&bytes, rows * k, &mut at, f32::from_le_bytes);
    assert!(codes.iter().all(|&c| c == 0), "row statuses {codes:?}");
    LogitStats::from_parts(rows, vocab, k, lse, entropy, q.map(|_| kl), count, ids, logprobs).expect("layout")
}

#[test]
fn emulated_kernels_match_float64_on_every_row_shape_dtype_and_alignment() {
    let Some(emu) = emulator() else { return };
    let seed = fresh_seed();
    let dir = tempfile_dir("shapes");
    for (i, &(rows, vocab, k)) in
        [(7, 129_280, 20), (14, 4099, 5), (9, 1000, 1), (7, 33, 20), (5, 3, 4), (3, 1, 2), (4, 50_001, 0)]
            .iter()
            .enumerate()
    {
        let mut rng = Rng::new(seed.wrapping_add(i as u64));
        let p = mixed_logits(&mut rng, rows, vocab);
        let mut q = perturbed(&mut rng, &p, 0.1);
        if rows > 3 {
            for x in &mut q[vocab..2 * vocab] {
                *x -= 150.0;
            }
            let finite: Vec<usize> = (2 * vocab..3 * vocab).filter(|&i| p[i].is_finite()).collect();
            if finite.len() >= 2 {
                q[finite[0]] = f32::NEG_INFINITY;
            }
        }
        for (bf, pair) in [
            ((false, false), false),
            ((true, true), false),
            ((false, false), true),
            ((true, true), true),
            ((false, true), true),
            ((true, false), true),
        ] {
            let context = format!(
                "seed {seed} (BASECAMP_TEST_SEED={seed}), rows {rows}, vocab {vocab}, k {k}, bf16 {bf:?}, pair {pair}"
            );
            let out = run(&emu, &dir, &p, pair.then_some(&q[..]), bf, rows, vocab, k);
            out.check_written().unwrap_or_else(|e| panic!("{e}; {context}"));
            let (p16, q16) = (to_bf16(&p), to_bf16(&q));
            let pv =
                if bf.0 { LogitsView::bf16(&p16, rows, vocab) } else { LogitsView::f32(&p, rows, vocab) }.expect("p");
            let qv =
                if bf.1 { LogitsView::bf16(&q16, rows, vocab) } else { LogitsView::f32(&q, rows, vocab) }.expect("q");
            let want = reference(pv, pair.then_some(qv), k).expect("valid");
            let dev = deviation(&out, &want);
            println!("{context}: {dev:?}");
            assert!(dev.within(LIMIT, KL_FLOOR), "relative error {dev:?}; {context}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn emulated_kernels_keep_q_mass_when_p_jumps_far_up() {
    // A thread whose p stays near 0 holds q's mass at 79 on its own base;
    // merged with one whose p reaches 90 or 105, exp(0 - M) is 0 in float
    // (from 88 on a GPU, which flushes denormals; from 104 here) and that
    // mass was dropped. The CPU pass is held to the same rows in
    // gpu/src/logits/tests.rs.
    let Some(emu) = emulator() else { return };
    let dir = tempfile_dir("far-jump");
    let rows = far_jump_rows();
    let vocab = rows[0].0.len();
    let p: Vec<f32> = rows.iter().flat_map(|(p, _)| p.clone()).collect();
    let q: Vec<f32> = rows.iter().flat_map(|(_, q)| q.clone()).collect();
    let out = run(&emu, &dir, &p, Some(&q), (false, false), rows.len(), vocab, 3);
    let pv = LogitsView::f32(&p, rows.len(), vocab).expect("p");
    let qv = LogitsView::f32(&q, rows.len(), vocab).expect("q");
    let want = reference(pv, Some(qv), 3).expect("valid");
    let dev = deviation(&out, &want);
    assert!(dev.within(LIMIT, KL_FLOOR), "relative error {dev:?}; KL {:?}", out.kl());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn emulated_kernels_keep_kl_precise_when_q_is_shifted_far_from_p() {
    // The CPU pass is held to the same rows in gpu/src/logits/tests.rs: q as
    // log-probabilities (shift 16, which the kernel took only past 64), and
    // rows whose masked probe hides the shift (a second, realigned pass).
    let Some(emu) = emulator() else { return };
    let seed = fresh_seed();
    let dir = tempfile_dir("shifted");
    for (what, p, q) in shifted_q_rows(&mut Rng::new(seed)) {
        let vocab = p.len();
        let out = run(&emu, &dir, &p, Some(&q), (false, false), 1, vocab, 3);
        let want =
            reference(LogitsView::f32(&p, 1, vocab).expect("p"), Some(LogitsView::f32(&q, 1, vocab).expect("q")), 3)
                .expect("valid")[0]
                .kl
                .expect("pair");
        let got = f64::from(out.kl().expect("pair")[0]);
        println!("{what}: KL {got:e} vs {want:e}");
        assert!(shifted_kl_close(got, want), "{what}: KL {got:e} vs {want:e}; seed {seed}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A scratch directory of the test `name` (tests run concurrently, and with
/// BASECAMP_TEST_SEED set every one sees the same seed).
fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("basecamp-emulate-{name}-{}-{}", std::process::id(), fresh_seed()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
