module github.com/engramkv/engram/adaptors

go 1.26.8

require (
	github.com/engramkv/engram/sdk v0.0.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/engramkv/engram/abi v0.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/engramkv/engram/abi => ../abi
	github.com/engramkv/engram/sdk => ../sdk
)
