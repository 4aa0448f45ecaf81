module github.com/engramkv/engram/wasm/testplugins

go 1.26.8

require (
	github.com/engramkv/engram/internal/btree v0.0.0
	github.com/engramkv/engram/wasm/abi v0.0.0
	github.com/engramkv/engram/wasm/sdk v0.0.0
)

replace (
	github.com/engramkv/engram/internal/btree => ../../internal/btree
	github.com/engramkv/engram/wasm/abi => ../abi
	github.com/engramkv/engram/wasm/sdk => ../sdk
)
