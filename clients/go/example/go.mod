module example.com/ratelimitd-example

go 1.21

require github.com/ratelimitd/ratelimitd/clients/go v0.0.0

// This module consumes the client as an application would; the replace points at the
// checkout instead of a tagged release.
replace github.com/ratelimitd/ratelimitd/clients/go => ../
