module github.com/engramkv/engram/wasm/sdk

go 1.26.8

require github.com/engramkv/engram/wasm/abi v0.0.0

replace github.com/engramkv/engram/wasm/abi => ../abi
