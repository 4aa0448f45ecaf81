module github.com/engramkv/engram/abi

go 1.26.8
