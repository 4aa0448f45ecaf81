module github.com/engramkv/engram/wasm/abi

go 1.26.8
