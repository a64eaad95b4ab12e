//! A bounded name for a Kubernetes API failure, shared by the modules that
//! call the API (their error enums delegate to it).

/// `Forbidden`, `Conflict`, `Invalid`, `NotFound`, `ApiRejected` (other
/// 4xx/5xx answers) or `ApiUnreachable` (no answer).
pub fn category(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) if status.is_forbidden() => "Forbidden",
        kube::Error::Api(status) if status.is_conflict() => "Conflict",
        kube::Error::Api(status) if status.is_invalid() => "Invalid",
        kube::Error::Api(status) if status.is_not_found() => "NotFound",
        kube::Error::Api(_) => "ApiRejected",
        _ => "ApiUnreachable",
    }
}

/// Whether the API said 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found())
}
