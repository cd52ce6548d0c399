"""meshbridge's validating admission webhook: the kinds meshbridge reads, checked at
`kubectl apply` with the same code that decodes them for serving."""
