//! The router's actor: how threads other than its own reach a router (the
//! watch evaluator, a backup). A thin shell: each message is one call on
//! the [`Router`] it wraps. A connection calls its thread's router
//! directly instead: through the mailbox, a request cost three task polls
//! on its thread (the connection, the actor, the reply) where one does.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, ResponseFuture};
use rankd_shards::ShardImage;

use super::Router;
use crate::error::Error;
use crate::protocol::{Op, Reply};

/// The actor over one I/O thread's router.
pub struct RouterActor(pub Arc<Router>);

impl Actor for RouterActor {
    type Context = Context<Self>;
}

/// Asks the router to run a batch of operations, in order (see
/// [`Router::dispatch_batch`]). Never answered in place: that is for a
/// client's lone request, and these come from the server's own tasks.
pub struct Dispatch(pub Vec<Op>);

impl Message for Dispatch {
    type Result = Vec<Result<Reply, Error>>;
}

/// Answered once every shard has made durable everything it did before
/// the fence reached it (see [`Router::fence`]).
pub struct Fence;

impl Message for Fence {
    type Result = Result<(), Error>;
}

/// Asks every shard for an image of what it has committed, at one cut
/// across shards (see [`Router::take_images`]).
pub struct TakeImages;

impl Message for TakeImages {
    type Result = Result<Vec<ShardImage>, Error>;
}

impl Handler<Dispatch> for RouterActor {
    type Result = ResponseFuture<Vec<Result<Reply, Error>>>;

    fn handle(&mut self, Dispatch(ops): Dispatch, _: &mut Self::Context) -> Self::Result {
        Box::pin(self.0.dispatch_batch(ops, false).all())
    }
}

impl Handler<Fence> for RouterActor {
    type Result = ResponseFuture<Result<(), Error>>;

    fn handle(&mut self, _: Fence, _: &mut Self::Context) -> Self::Result {
        Box::pin(self.0.fence())
    }
}

impl Handler<TakeImages> for RouterActor {
    type Result = ResponseFuture<Result<Vec<ShardImage>, Error>>;

    fn handle(&mut self, _: TakeImages, _: &mut Self::Context) -> Self::Result {
        Box::pin(self.0.take_images())
    }
}
