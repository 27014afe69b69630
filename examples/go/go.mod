module zinfer.example/client

go 1.21

require (
	github.com/pebbe/zmq4 v1.2.11
	github.com/vmihailenco/msgpack/v5 v5.4.1
)
