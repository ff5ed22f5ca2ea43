//! What EC2 does not show yet of an ENI it has just created or attached ([`crate::NewEniLag`]):
//! describes do not list a new ENI, nor show a new attachment, for the lag's window; within that
//! window the first calls naming a new ENI answer `InvalidNetworkInterfaceID.NotFound`, unperformed.

use tokio::time::Instant;

use super::{Attachment, Ec2Result, World, eni_not_found};

impl World {
    /// The ENI `id`, if describes at `now` list it: EC2's not-found otherwise (unknown, or created
    /// less than the new-ENI lag ago).
    pub(super) fn eni_listed(&self, id: &str, now: Instant) -> Ec2Result<()> {
        let eni = self.eni_ref(id)?;
        let window = self.timing.new_eni_lag.window;
        match eni.created_by_call {
            Some(at) if at + window > now => Err(eni_not_found(id)),
            _ => Ok(()),
        }
    }

    /// Whether describes at `now` show attachment `a` (made at least the new-ENI lag ago).
    pub(super) fn attachment_shown(&self, a: &Attachment, now: Instant) -> bool {
        a.attached_by_call
            .is_none_or(|at| at + self.timing.new_eni_lag.window <= now)
    }

    /// A call naming ENI `id` at `now`: refused as not found when the ENI is within the new-ENI lag
    /// after its create and has refusals left (as many as the lag gave it at its create).
    pub(super) fn refuse_while_new(&mut self, id: &str, now: Instant) -> Ec2Result<()> {
        let window = self.timing.new_eni_lag.window;
        self.eni_ref(id)?;
        let eni = self.enis.get_mut(id).expect("checked");
        let new = eni.created_by_call.is_some_and(|at| at + window > now);
        if new && eni.refusals_left > 0 {
            eni.refusals_left -= 1;
            return Err(eni_not_found(id));
        }
        Ok(())
    }
}
