//! A release: the attachment's IP goes idle (cooling, maybe reserved for its sticky key); and its
//! undo, when recording the release failed.

use tokio::time::Instant;

use super::PoolState;
use crate::model::AttachmentKey;
use crate::pool::idle::Reservation;
use crate::pool::types::{ReleaseUndo, Released};

impl PoolState {
    /// Releases `key`'s IP into the idle queue (cooling; reserved for its sticky key when `sticky`).
    /// `None` when the attachment holds nothing (a no-op, as CNI DEL requires).
    pub fn release(&mut self, key: &AttachmentKey, sticky: bool, now: Instant) -> Option<Released> {
        if let Some(p) = self.pending.get_mut(key) {
            p.released = true;
            return None;
        }
        let rec = self.allocations.remove(key)?;
        self.assigned.remove(&rec.ip);
        let reservation = (sticky && !self.config.ip_stick_time.is_zero()).then(|| Reservation {
            key: rec
                .sticky_key
                .clone()
                .unwrap_or_else(|| rec.pod.sticky_key()),
            until: now + self.config.ip_stick_time,
        });
        let released = Released {
            ip: rec.ip,
            reservation: reservation.as_ref().map(|r| (r.key.clone(), r.until)),
            undo: ReleaseUndo {
                key: key.clone(),
                record: rec.clone(),
            },
        };
        self.park_idle(
            rec.ip,
            rec.eni,
            now,
            self.config.reuse_cooldown,
            reservation,
        );
        Some(released)
    }

    /// Puts a released allocation back as it was (recording the release failed), if its IP is still
    /// idle: `false` when the IP has gone to another pod or away meanwhile.
    pub fn undo_release(&mut self, undo: &ReleaseUndo) -> bool {
        let ip = undo.record.ip;
        if self.allocations.contains_key(&undo.key)
            || (self.idle.remove(ip).is_none() && self.held_back.remove(&ip).is_none())
        {
            return false;
        }
        self.assigned.insert(ip, undo.key.clone());
        self.allocations
            .insert(undo.key.clone(), undo.record.clone());
        true
    }
}
