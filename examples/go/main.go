// Command client streams a generation from a zinfer router with a stock Go
// ZeroMQ binding (pebbe/zmq4, over the system libzmq) and msgpack:
//
//	cd examples/go && go mod tidy && go run . tcp://127.0.0.1:5555 "Give me three tips for staying healthy."
//
// The text streams to stdout; the `done` summary goes to stderr. The wire
// protocol is in docs/protocol.md.
package main

import (
	"fmt"
	"os"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

func main() {
	endpoint, prompt := "tcp://127.0.0.1:5555", "Give me three tips for staying healthy."
	if len(os.Args) > 1 {
		endpoint = os.Args[1]
	}
	if len(os.Args) > 2 {
		prompt = os.Args[2]
	}
	os.Exit(run(endpoint, prompt))
}

func run(endpoint, prompt string) int {
	socket, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer socket.Close()
	socket.SetLinger(0)
	socket.SetRcvtimeo(60 * time.Second)
	if err := socket.Connect(endpoint); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	id := fmt.Sprintf("go-%d", time.Now().UnixNano())
	request, _ := msgpack.Marshal(map[string]any{
		"type":        "generate",
		"id":          id,
		"messages":    []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens":  64,
		"temperature": 0,
		"stream":      true,
	})
	if _, err := socket.SendBytes(request, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	for {
		frame, err := socket.RecvBytes(0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "no reply from %s: %v\n", endpoint, err)
			return 1
		}
		var reply map[string]any
		if err := msgpack.Unmarshal(frame, &reply); err != nil {
			fmt.Fprintln(os.Stderr, "bad reply:", err)
			return 1
		}
		if reply["id"] != id {
			continue
		}
		switch reply["type"] {
		case "chunk":
			fmt.Print(reply["text"])
		case "done":
			usage, _ := reply["usage"].(map[string]any)
			fmt.Println()
			fmt.Fprintf(os.Stderr, "finish_reason=%v prompt_tokens=%v completion_tokens=%v worker=%v\n",
				reply["finish_reason"], usage["prompt_tokens"], usage["completion_tokens"], reply["worker"])
			return 0
		default:
			fmt.Fprintf(os.Stderr, "error %v: %v\n", reply["code"], reply["message"])
			return 2
		}
	}
}
