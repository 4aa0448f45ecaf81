module github.com/engramkv/engram/sdk

go 1.26.8

require github.com/engramkv/engram/abi v0.0.0

replace github.com/engramkv/engram/abi => ../abi
