module github.com/ratelimitd/ratelimitd/clients/go

go 1.21
