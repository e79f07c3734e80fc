module ratelimitd

go 1.19
