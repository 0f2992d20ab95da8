//! Key spaces: which row id each request reads.
//!
//! Ids are `0..keyspace` (the rows `load` creates). Three shapes:
//! - `hot`: every request reads id 0;
//! - `uniform`: ids drawn uniformly;
//! - `zipf`: Zipf(s) over ranks `1..=keyspace` (rand_distr's rejection-inversion sampler, which
//!   is exact for any `s > 0`), rank `r` mapped to an id by a fixed bijection so that the hot
//!   ids are scattered over the table rather than packed into its first heap pages.
//!
//! # Thread model
//! A [`KeySampler`] is owned by one client task (each with its own seeded RNG).

#![deny(unsafe_code)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Odd prime used to scatter Zipf ranks over the id space (`rank * P mod n` is a bijection
/// whenever `n` is not a multiple of `P`, true for every `n < P`).
const SCATTER_PRIME: u64 = 2_654_435_761;

/// The shape of the key space, as chosen by `--keys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyShape {
    /// One hot key (id 0).
    Hot,
    /// Ids drawn uniformly from the key space.
    Uniform,
    /// Zipf-distributed ranks (`--zipf-s`).
    Zipf,
}

impl KeyShape {
    /// The name written to JSONL.
    pub fn name(self) -> &'static str {
        match self {
            KeyShape::Hot => "hot",
            KeyShape::Uniform => "uniform",
            KeyShape::Zipf => "zipf",
        }
    }
}

/// Draws row ids for one client.
pub struct KeySampler {
    shape: KeyShape,
    keyspace: u64,
    zipf: Option<Zipf<f64>>,
    rng: SmallRng,
    /// Draws index this list instead of being the ids (`--slots`: one shard's ids).
    ids: Option<std::sync::Arc<[u64]>>,
}

impl KeySampler {
    /// A sampler over `0..keyspace`; `seed` makes runs reproducible per client.
    pub fn new(shape: KeyShape, keyspace: u64, zipf_s: f64, seed: u64) -> Result<Self, String> {
        if keyspace == 0 {
            return Err("keyspace must be at least 1".into());
        }
        let zipf = match shape {
            KeyShape::Zipf => Some(
                Zipf::new(keyspace, zipf_s)
                    .map_err(|e| format!("zipf({keyspace}, {zipf_s}): {e}"))?,
            ),
            _ => None,
        };
        Ok(KeySampler {
            shape,
            keyspace,
            zipf,
            rng: SmallRng::seed_from_u64(seed),
            ids: None,
        })
    }

    /// A sampler over the ids in `ids` (the shape applies to their positions).
    pub fn over(
        shape: KeyShape,
        ids: std::sync::Arc<[u64]>,
        zipf_s: f64,
        seed: u64,
    ) -> Result<Self, String> {
        let mut s = KeySampler::new(shape, ids.len() as u64, zipf_s, seed)?;
        s.ids = Some(ids);
        Ok(s)
    }

    /// The next row id.
    pub fn next_id(&mut self) -> u64 {
        let i = self.next_index();
        match &self.ids {
            Some(ids) => ids[i as usize],
            None => i,
        }
    }

    fn next_index(&mut self) -> u64 {
        match (self.shape, &self.zipf) {
            (KeyShape::Hot, _) => 0,
            (KeyShape::Zipf, Some(z)) => {
                let rank = z.sample(&mut self.rng) as u64; // 1..=keyspace
                rank_to_id(rank.clamp(1, self.keyspace), self.keyspace)
            }
            _ => self.rng.gen_range(0..self.keyspace),
        }
    }
}

/// The ids of `0..keyspace` whose key `<prefix><id>` hashes into Redis Cluster slots
/// `lo..=hi` (`--slots`).
pub fn ids_in_slots(prefix: &str, keyspace: u64, (lo, hi): (u16, u16)) -> Vec<u64> {
    let mut key = Vec::with_capacity(prefix.len() + 20);
    (0..keyspace)
        .filter(|id| {
            key.clear();
            key.extend_from_slice(prefix.as_bytes());
            key.extend_from_slice(itoa::Buffer::new().format(*id).as_bytes());
            (lo..=hi).contains(&pgline_dataplane::cluster::key_slot(&key))
        })
        .collect()
}

/// Maps Zipf rank `1..=n` to an id in `0..n`, bijectively (rank 1 is id 0).
pub fn rank_to_id(rank: u64, n: u64) -> u64 {
    let r = u128::from(rank - 1);
    ((r * u128::from(SCATTER_PRIME)) % u128::from(n)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn slot_ids_are_the_keys_of_those_slots() {
        use pgline_dataplane::cluster::key_slot;
        let ids = ids_in_slots("t:", 3000, (0, 5460));
        // About a third of the ids, each in range, none missed.
        assert!((800..1200).contains(&ids.len()), "{}", ids.len());
        for id in 0..3000u64 {
            let inside = key_slot(format!("t:{id}").as_bytes()) <= 5460;
            assert_eq!(ids.binary_search(&id).is_ok(), inside, "id {id}");
        }
        let ids: std::sync::Arc<[u64]> = ids.into();
        let mut s = KeySampler::over(KeyShape::Uniform, ids.clone(), 0.99, 3).unwrap();
        assert!((0..1000).all(|_| ids.binary_search(&s.next_id()).is_ok()));
    }

    #[test]
    fn rank_to_id_is_a_bijection() {
        for n in [1u64, 2, 7, 1000, 4096] {
            let ids: HashSet<u64> = (1..=n).map(|r| rank_to_id(r, n)).collect();
            assert_eq!(ids.len() as u64, n);
            assert!(ids.iter().all(|&i| i < n));
        }
        assert_eq!(rank_to_id(1, 100_000), 0);
    }

    #[test]
    fn hot_is_one_key_and_uniform_covers_the_space() {
        let mut hot = KeySampler::new(KeyShape::Hot, 1000, 0.99, 1).unwrap();
        assert!((0..1000).all(|_| hot.next_id() == 0));
        let mut u = KeySampler::new(KeyShape::Uniform, 10, 0.99, 1).unwrap();
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[u.next_id() as usize] += 1;
        }
        // Each bucket expects 10,000; 5 sigma is ~475.
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }

    /// Frequencies of the top ranks match p(r) = r^-s / H(n, s) within sampling error, and the
    /// head/tail split is right, for s = 0.99 over 10,000 keys.
    #[test]
    fn zipf_matches_the_exact_distribution() {
        let (n, s, draws) = (10_000u64, 0.99f64, 400_000u32);
        let h: f64 = (1..=n).map(|r| (r as f64).powf(-s)).sum();
        let mut z = KeySampler::new(KeyShape::Zipf, n, s, 7).unwrap();
        let mut counts = vec![0u32; n as usize];
        for _ in 0..draws {
            counts[z.next_id() as usize] += 1;
        }
        for rank in 1..=5u64 {
            let p = (rank as f64).powf(-s) / h;
            let expect = p * f64::from(draws);
            let got = f64::from(counts[rank_to_id(rank, n) as usize]);
            let sigma = (expect * (1.0 - p)).sqrt();
            assert!(
                (got - expect).abs() < 5.0 * sigma,
                "rank {rank}: got {got}, expect {expect}"
            );
        }
        // Share of the top 1 % of ranks.
        let top: f64 = (1..=n / 100).map(|r| (r as f64).powf(-s)).sum::<f64>() / h;
        let got_top: u32 = (1..=n / 100)
            .map(|r| counts[rank_to_id(r, n) as usize])
            .sum();
        let share = f64::from(got_top) / f64::from(draws);
        assert!(
            (share - top).abs() < 0.01,
            "top 1%: got {share}, expect {top}"
        );
        // Rank 1 is about 2^0.99 times as frequent as rank 2.
        let ratio = f64::from(counts[rank_to_id(1, n) as usize])
            / f64::from(counts[rank_to_id(2, n) as usize]);
        assert!((ratio - 2f64.powf(s)).abs() < 0.15, "ratio {ratio}");
    }

    #[test]
    fn rejects_an_empty_keyspace_and_bad_exponent() {
        assert!(KeySampler::new(KeyShape::Uniform, 0, 0.99, 1).is_err());
        assert!(KeySampler::new(KeyShape::Zipf, 10, -1.0, 1).is_err());
    }
}
