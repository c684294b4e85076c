//! The types the caches keep in place of the Kubernetes kinds they watch (the operator's
//! `operator::slim`, the bridge's `bridge::cached`): each is read from the wire as its kind and
//! trimmed at once. `stands_for!` makes one watched, listed and keyed as the kind it stands for.

/// `stands_for!(Cached, Kind)`: `Cached` (with a `metadata: ObjectMeta` field) is watched,
/// listed and keyed as the namespaced `Kind` (whose names it borrows: no allocation).
macro_rules! stands_for {
    ($cached:ty, $kind:ty) => {
        impl kube::Resource for $cached {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::kind(&())
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::group(&())
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::version(&())
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::plural(&())
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use stands_for;
