"""uvicorn's sans-I/O WebSocket protocol with a bound on the pongs it queues for a client that does not read.

uvicorn answers each ping by writing the pong to the transport at once, whatever the transport holds unsent.
A client that sends pings and reads nothing (no start message or API key needed: pings never reach the app)
grew the server by 20-25 MB/s, and a closed stream kept that memory for as long as the client kept the socket
open (a review measured 551 -> 666 MiB after a 5-s flood). Here a pong is left out while more than
:data:`PONG_BACKLOG` bytes wait to be sent: a client that reads gets every pong, one that does not cannot make
the server hold more than that for it.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

PONG_BACKLOG = 1 << 20  # bytes waiting in the transport beyond which pongs are left out


class BoundedPongProtocol(WebSocketsSansIOProtocol):
    def handle_ping(self) -> None:
        output = b"".join(
            self.conn.data_to_send()
        )  # taken out either way, or it would pile up in the connection
        if self.transport.get_write_buffer_size() <= PONG_BACKLOG:
            self.transport.write(output)
