//! The [`Metadata`] (IMDS) reads of [`MemoryCloud`]: what the node sees at once of its ENIs.

use async_trait::async_trait;

use eniipam_cloud::{CloudResult, InstanceIdentity, Metadata, MetadataEni};

use crate::{Action, MemoryCloud};

#[async_trait]
impl Metadata for MemoryCloud {
    async fn identity(&self) -> CloudResult<InstanceIdentity> {
        self.call(Action::MetadataIdentity, String::new(), |st| {
            let spec = &st.instance.spec;
            Ok(InstanceIdentity {
                instance_id: spec.instance_id.clone(),
                instance_type: spec.instance_type.clone(),
                availability_zone: spec.availability_zone.clone(),
                mac: st.instance.primary_mac.clone(),
            })
        })
        .await
    }

    async fn interfaces(&self) -> CloudResult<Vec<MetadataEni>> {
        self.call(Action::MetadataInterfaces, String::new(), |st| {
            Ok(st
                .attached()
                .into_iter()
                .map(|e| st.metadata_eni(e))
                .collect())
        })
        .await
    }

    async fn interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>> {
        self.call(Action::MetadataInterface, format!("mac={mac}"), |st| {
            Ok(st
                .attached()
                .into_iter()
                .find(|e| e.mac == mac)
                .map(|e| st.metadata_eni(e)))
        })
        .await
    }
}
